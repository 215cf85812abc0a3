"""The cluster simulator (`deepring simulate`): the real scheduler and routers on simulated time."""
