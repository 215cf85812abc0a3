"""`deepring conformance`: property-based checks of a live server (issue 24).

Hypothesis draws request bodies of each protocol (`bodies`: valid and deliberately invalid;
`variants` points them at the served model and makes their deterministic twins), `checks`
sends them over the wire (`wire`: raw HTTP and a strict SSE reader), reduces the answers
(`outputs`) and checks the properties (`properties/`) against the expected side from
deepring_recipe (`oracle`); `runner` drives a run and `report` prints the table and JUnit XML.

Needs hypothesis (and jsonschema for the response_format property): the engine's
`conformance` extra.
"""
