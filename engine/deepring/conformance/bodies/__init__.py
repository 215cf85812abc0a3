"""Hypothesis strategies for request bodies of the three protocols (issue 3).

`request_cases(protocol)` draws {"protocol", "body", "options"}: a request body (a dict, or its
JSON as str or bytes) for OpenAI Chat Completions ("chat"), OpenAI Responses ("responses") or
Anthropic Messages ("messages"), and a ConversionOptions spec (tests/conformance/summary builds it).

How a case is drawn:

1. a ConversionOptions spec (defaults half of the time; aliases, thinking default, reasoning
   behaviour, web-search behaviours, max-token bounds, special-token overrides otherwise);
2. a *fault set*: empty for about 45% of the cases, else one or two fault kinds of
   the protocol (`FAULTS`). With no fault every choice is made among values the official
   accepts, so most such cases convert; each fault kind opens one family of invalid choices
   (out-of-range options, broken tool histories, bad images, invalid schemas, wrong enum
   values, a generic structural mutation, ...);
3. an abstract conversation script (system / user / reminder / assistant steps with
   reasoning and tool calls / tool results / trailing or prefix assistant), rendered into the
   protocol's shapes, and the protocol's options.

Hypothesis favours the simplest choice (0, the first element, False) well beyond its uniform
share in nested draws, so every choice is arranged with the simplest value being valid and
`Ctx.chance` is False on 0.

Modules: `values` (text and JSON values), `option_specs` (ConversionOptions specs),
`context` (the per-case `Ctx` and `FAULTS`), `schemas` (JSON schemas and abstract tools),
`images`, `script` (the abstract conversation script), `fields` (options shared by the
protocols), `chat` / `responses` / `messages` (one protocol's bodies), `mutation` (the generic
mutation), `cases` (`request_cases`), `bounded` (requests whose output a grammar-enforcing
server finishes in a few tokens: `deepring conformance` only). What other modules use is
re-exported here.

The conformance tests (tests/conformance) and `deepring conformance` (deepring.conformance)
both draw from here.
"""

from .cases import request_cases
from .context import FAULTS
from .option_specs import conversion_options
from .values import CHARS, chance

__all__ = ["CHARS", "FAULTS", "chance", "conversion_options", "request_cases"]
