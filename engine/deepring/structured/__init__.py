"""Structured output: grammar-constrained decoding with llguidance.

- `constraint`: `Constraint`, what a request carries on the rings (a grammar in llguidance's
  Lark dialect and what kind of request it came from). Torch-free, llguidance-free.
- `grammar`: grammars for JSON (any object or a JSON Schema) and regexes, the thinking prefix,
  and `validate` (llguidance, torch-free: the frontend refuses what cannot compile with a 400).
- `tools`: the DSML tool-call grammar of a tool list (parameters checked against each schema).
- `build`: the recipe's resolved `OutputConstraint` -> `Constraint` (what the frontend and
  `LLM` call).
- `runtime`: the worker side: the grammar compiler (an LRU of compiled grammars), a request's
  matcher, and the batched token bitmask applied to the logits before sampling (torch).

Only `runtime` imports torch; the frontend uses the other modules.
"""
