"""The rings between the serving processes: typed messages, their codec, socket helpers."""
