"""Structured output (issue 26) on the embedded tiny model: every output of a JSON Schema, regex
or tool-call constraint is checked by an independent validator (jsonschema, re.fullmatch, the
official deepseek_recipe parser), greedy and sampled; the matcher survives preemption and
resuming from the output so far (handoff, reroute); the grammars, the wire and the 400s.

Schemas and regexes are drawn so that every output can complete (bounded strings, numbers,
arrays, no additional properties) well within max_tokens, and every output must end with the
reason `stop`: the grammar, not the token budget, ended it."""

from __future__ import annotations

import json
import re

import deepseek_recipe as official
import jsonschema
import pytest
from deepring import LLM, SamplingParams
from deepring.ipc import codec
from deepring.ipc.messages import Handoff, Submit
from deepring.ipc.validate import constraint_problem
from deepring.protocol.errors import ApiError
from deepring.protocol.formats import PromptFormat
from deepring.protocol.prepare import CHAT, Recipe
from deepring.structured import build
from deepring.structured.constraint import MAX_GRAMMAR_CHARS, Constraint
from deepring.structured.grammar import GrammarError, Markers
from deepring.structured.runtime import GrammarCompiler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EOS = 1
THINK_END, DSML = 128822, 128825
MAX_TOKENS = 160
EXAMPLES = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=8, max_model_len=1024)


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
        SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=7),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=MAX_TOKENS, seed=11),
    ]


def _answers(llm, prompt, constraint) -> list[str]:
    """The text of each output (greedy and two sampled), each ended by the grammar."""
    params = _params()
    outs = llm.generate([prompt] * len(params), params, constraints=constraint)
    texts = []
    for o in outs:
        assert o.finish_reason == "stop", (o.finish_reason, o.text)
        assert o.token_ids[-1] == EOS
        texts.append(llm.tokenizer.decode(o.token_ids[:-1]))
    return texts


# ---- JSON Schema --------------------------------------------------------------------------------

_WORD = st.text("abcxyz", min_size=1, max_size=4)
_LEAF = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.integers(-50, 50).map(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 99}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.just({"type": "string", "pattern": "^[a-z]{1,4}$"}),
    st.just({"type": "string", "pattern": "[0-9]", "maxLength": 5}),
    st.lists(_WORD, min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
    st.lists(st.integers(0, 99), min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
    _WORD.map(lambda w: {"const": w}),
)


def _objects(children):
    props = st.dictionaries(st.text("abcdef", min_size=1, max_size=5), children, max_size=3)

    @st.composite
    def obj(draw):
        p = draw(props)
        required = draw(st.lists(st.sampled_from(sorted(p)), unique=True)) if p else []
        return {
            "type": "object",
            "properties": p,
            "required": required,
            "additionalProperties": False,
        }

    return obj()


_SCHEMA = st.recursive(
    _LEAF,
    lambda children: st.one_of(
        st.builds(
            lambda s, n: {"type": "array", "items": s, "maxItems": n}, children, st.integers(0, 3)
        ),
        st.lists(children, min_size=2, max_size=2).map(lambda ss: {"anyOf": ss}),
        _objects(children),
    ),
    max_leaves=5,
)


@EXAMPLES
@given(schema=_SCHEMA)
def test_every_output_validates_against_its_json_schema(llm, schema):
    for text in _answers(llm, "Write JSON.", build.json_schema(schema)):
        jsonschema.validate(json.loads(text), schema)


def test_json_object_gives_an_object_or_a_truncated_one(llm):
    c = build.json_schema(None)
    outs = llm.generate(["a json object"] * 2, _params()[:2], constraints=c)
    for o in outs:
        text = llm.tokenizer.decode([t for t in o.token_ids if t != EOS])
        if o.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # the budget ran out inside the object: it is still its beginning
            assert o.finish_reason == "length"
            assert text.startswith("{")


# ---- regex --------------------------------------------------------------------------------------


def _regexes():
    atom = st.one_of(
        st.sampled_from("abcxyz019-"),
        st.sampled_from(["[a-c]", "[0-9]", "[xyz]", "\\d"]),
    )
    piece = st.tuples(atom, st.sampled_from(["", "?", "{1,3}", "{2}"])).map("".join)
    seq = st.lists(piece, min_size=1, max_size=4).map("".join)
    return st.lists(seq, min_size=1, max_size=3).map(lambda alts: "(" + "|".join(alts) + ")")


@EXAMPLES
@given(regex=_regexes())
def test_every_output_matches_its_regex(llm, regex):
    for text in _answers(llm, "Match the pattern.", build.regex(regex)):
        assert re.fullmatch(regex, text), (regex, text)


# ---- tool calls ---------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 6},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "seats": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["a1", "b2"]},
                        "maxItems": 2,
                    },
                    "who": {
                        "type": "object",
                        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["id"],
                        "additionalProperties": False,
                    },
                },
                "required": ["seats", "who"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _body(tool_choice, tools=TOOLS) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Call a tool."}],
        "tools": tools,
        "tool_choice": tool_choice,
        "thinking": {"type": "disabled"},
    }


def _official_response(body: dict, ids: list[int], tokenizer_path) -> dict:
    """The official library's Chat Completions response for these output ids."""
    options = official.ConversionOptions().with_model_alias(
        "tiny", official.ModelVersion.DeepseekV4Pro
    )
    conv = official.ChatCompletionRequest(body).convert(options)
    gen = official.ChatCompletionRequest.chunk_generator(conv, "chatcmpl-1", "tiny")
    tok = official.Tokenizer.from_file(str(tokenizer_path))
    proc = official.StreamProcessor(gen, conv.parsing_options, tok)
    resp = official.ChatCompletionResponse("chatcmpl-1", "tiny", 0, 1, 0)
    events = proc.push(official.InferenceChunk.tokens(ids))
    events += proc.push(official.InferenceChunk.finish(official.InferenceFinishReason.Stop))
    events += proc.finish()
    for e in events:
        resp.accumulate(e)
    return json.loads(resp.to_json())


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "book"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_parse_and_validate_with_the_official_parser(
    llm, tool_choice, v41_tokenizer_path
):
    body = _body(tool_choice)
    params = _params()
    outs = llm.generate([body] * len(params), params)
    for o in outs:
        ids = o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids
        msg = _official_response(body, ids, v41_tokenizer_path)["choices"][0]
        assert msg["finish_reason"] == "tool_calls"
        calls = msg["message"]["tool_calls"]
        if o.finish_reason == "length":
            # A random model may chain invokes until the budget ends: the last one can be cut
            # short, every earlier one is complete.
            calls = calls[:-1]
        else:
            assert o.finish_reason == "stop"
        assert calls
        for call in calls:
            name = call["function"]["name"]
            if isinstance(tool_choice, dict):
                assert name == "book"
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_auto_tool_choice_answers_in_text_or_a_well_formed_block(llm, v41_tokenizer_path):
    body = _body("auto")
    c = llm._encode(body)[1]
    assert c is not None
    assert c.kind == "tool_call"
    compiler = GrammarCompiler(llm.engine.tokenizer_path, 129281, [EOS])
    block = _dsml('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                  'string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="unit" '
                  'string="true">c</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
                  compiler)  # fmt: skip
    text = compiler.tokenizer.tokenize_str("Sure <b>ok</b>\n\n<")
    opener = [DSML, *compiler.tokenizer.tokenize_str("tool_calls>\n")]
    whole = [*text, *opener, *block, EOS]
    assert compiler.state(c, whole) is not None  # text, then a block
    assert compiler.state(c, [*text, EOS]) is not None  # text alone
    bad = _dsml('<｜DSML｜invoke name="nope">\n', compiler)  # an undeclared tool
    with pytest.raises(ValueError, match="does not match"):
        compiler.state(c, [*text, *opener, *bad])
    got = _official_response(body, whole[:-1], v41_tokenizer_path)["choices"][0]["message"]
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris",
        "unit": "c",
    }
    for o in llm.generate([body] * 2, _params()[:2]):
        msg = _official_response(body, [t for t in o.token_ids if t != EOS], v41_tokenizer_path)
        for call in msg["choices"][0]["message"].get("tool_calls") or ():
            name = call["function"]["name"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def _dsml(text: str, compiler) -> list[int]:
    """Token ids of DSML text: each `｜DSML｜` the special token, the rest plain text."""
    ids: list[int] = []
    for i, part in enumerate(text.split("｜DSML｜")):
        if i:
            ids.append(DSML)
        ids += compiler.tokenizer.tokenize_str(part) if part else []
    return ids


# ---- thinking, resuming, preemption -------------------------------------------------------------


def test_in_thinking_mode_the_constraint_applies_after_the_reasoning(llm):
    c = build.json_schema({"type": "integer"}, reasoning=True, markers=Markers(THINK_END, DSML))
    compiler = GrammarCompiler(llm.engine.tokenizer_path, 129281, [EOS])
    tok = compiler.tokenizer
    think = tok.tokenize_str("Let me think {not json} <x>.\n")
    assert compiler.state(c, [*think, THINK_END, *tok.tokenize_str("42"), EOS]) is not None
    with pytest.raises(ValueError, match="does not match"):
        compiler.state(c, [*think, THINK_END, *tok.tokenize_str("oops")])
    with pytest.raises(ValueError, match="does not match"):  # no answer before the end
        compiler.state(c, [*think, EOS])


LIST = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 40}


def test_resuming_from_the_output_so_far_continues_exactly(llm):
    """What a decode worker does with a handoff and a prefill worker with a rerouted request:
    the matcher is rebuilt from the constraint and the output so far."""
    c = build.json_schema(LIST)
    prompt = [0, 11, 12, 13]
    for p in _params()[:2]:
        p = SamplingParams(temperature=p.temperature, max_tokens=14, seed=p.seed or 3)
        full = llm.generate(prompt, p, constraints=c)[0].token_ids
        for cut in (5,):
            req = llm.engine.add(10_000 + cut, prompt, p, seed=p.seed, output_ids=full[:cut],
                                 constraint=c)  # fmt: skip
            while llm.engine.has_work:
                llm.engine.step()
            assert req.output_ids == full


def test_preemption_keeps_the_matcher(deepring_cache_dir):
    prompts = [[(7 * i + 3 * j) % 1000 + 3 for j in range(n)] for i, n in enumerate((122, 120))]
    c = build.json_schema(LIST)
    p = SamplingParams(temperature=0, max_tokens=12)
    roomy = LLM("tiny", max_num_seqs=2, max_model_len=256)
    want = [o.token_ids for o in roomy.generate(prompts, p, constraints=c)]
    small = LLM("tiny", max_num_seqs=2, max_model_len=256, num_blocks=3)
    got = [o.token_ids for o in small.generate(prompts, p, constraints=c)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == want
    for ids in got:
        # A prefix of the list (the budget ends it): the grammar held through the recompute.
        assert re.fullmatch(r"\[[0-9](, [0-9])*(, ?)?", small.tokenizer.decode(ids))


# ---- errors, the wire ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_thinking=False)


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}},
         "uniqueItems"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "format": "bogus"}}}, "bogus"),
        ({"type": "regex", "regex": "a(?=b)"}, "look"),
    ],
    ids=["unimplemented-keyword", "unknown-format", "lookahead"],
)  # fmt: skip
def test_a_constraint_that_cannot_compile_is_a_400_naming_it(recipe, response_format, message):
    body = {"model": "m", "messages": [{"role": "user", "content": "json"}],
            "response_format": response_format}  # fmt: skip
    with pytest.raises(ApiError) as e:
        recipe.prepare(CHAT, body, 4096)
    assert e.value.status == 400
    assert message in e.value.message
    assert e.value.message.startswith("Invalid output constraint")


def test_prepared_requests_carry_their_constraint(recipe):
    body = {"model": "m", "messages": [{"role": "user", "content": "json"}],
            "response_format": {"type": "json_object"}}  # fmt: skip
    assert recipe.prepare(CHAT, body, 4096).constraint.kind == "json"
    body["tools"], body["tool_choice"] = TOOLS, "required"
    assert recipe.prepare(CHAT, body, 4096).constraint.kind == "tool_call_required"
    del body["response_format"], body["tools"], body["tool_choice"]
    assert recipe.prepare(CHAT, body, 4096).constraint is None


def test_a_strict_tool_the_grammar_cannot_enforce_is_refused():
    params = {"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 1}
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}
    with pytest.raises(GrammarError, match="minProperties"):
        build.tool_calls([tool], required=False, reasoning=False, markers=Markers(THINK_END, DSML))
    lenient = {"type": "function", "function": {**tool["function"], "strict": None}}
    c = build.tool_calls([lenient], required=False, reasoning=False, markers=Markers(1, DSML))
    assert c.kind == "tool_call"


def test_the_constraint_travels_in_submit_and_handoff():
    import numpy as np

    c = build.regex("[ab]+")
    ids = np.arange(5, dtype=np.int32)
    sub = Submit(rid=1, prompt_ids=ids, sampling=SamplingParams(), seed=1, decode_worker="decode-0",
                 decode_gen=1, decode_addr="ipc:///x", cache_class="chat", num_output=0,
                 constraint=c)  # fmt: skip
    assert codec.decode_strict(codec.encode(sub)).constraint == c
    plain = Submit(**{**sub.__dict__, "constraint": None})
    assert codec.decode_strict(codec.encode(plain)).constraint is None
    h = Handoff(rid=1, frontend_gen=0, token_ids=ids, prompt_len=4, num_cached=4, cache_hit=0,
                sampling=SamplingParams(), seed=1, decode_gen=1, cache_class="chat",
                slot_state=b"s", block_state=b"b", constraint=c)  # fmt: skip
    assert codec.decode_strict(codec.encode(h)).constraint == c
    assert constraint_problem(c) is None
    huge = Constraint("grammar", "x" * (MAX_GRAMMAR_CHARS + 1))
    assert "characters of grammar" in constraint_problem(huge)
    frames = codec.encode(sub)
    bad = codec.msgpack.unpackb(frames[0])
    bad["constraint"] = {"kind": "nonsense", "grammar": "start: x"}
    with pytest.raises(codec.MessageError):
        codec.decode_strict([codec.msgpack.packb(bad), *frames[1:]])


def test_the_compiler_is_built_ahead_for_workers(deepring_cache_dir):
    """prepare_grammars (called by every worker before it says ready) builds the compiler
    before it returns (on a helper thread, its GIL-holding tokenizer build starved the worker's
    heartbeats); the first constrained request then uses it instead of building its own."""
    llm = LLM("tiny", max_num_seqs=2, max_model_len=256)
    eng = llm.engine
    assert eng._grammars is None  # offline: built on the first constrained request
    eng.prepare_grammars()
    compiler = eng._grammars
    assert compiler is not None
    eng.prepare_grammars()  # idempotent
    assert eng._grammars is compiler
    c = build.regex("[0-9]{3}", reasoning=False, markers=Markers(THINK_END, DSML))
    (out,) = llm.generate(["Digits:"], SamplingParams(temperature=0, max_tokens=8), constraints=c)
    assert eng._grammars is compiler
    assert compiler.compiles == 1
    assert re.fullmatch("[0-9]{3}", llm.tokenizer.decode(out.token_ids[:-1]))


def test_a_compiler_that_cannot_be_built_fails_constrained_requests_only(
    deepring_cache_dir, tmp_path
):
    """A tokenizer file llguidance refuses: the worker still starts (prepare_grammars logs
    it), plain requests are served, and a constrained one fails with llguidance's reason."""
    llm = LLM("tiny", max_num_seqs=2, max_model_len=256)
    eng = llm.engine
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    eng.tokenizer_path = broken  # (the file constraints compile against, nothing else)
    eng.prepare_grammars()
    assert eng._grammars is None
    (plain,) = llm.generate(["Digits:"], SamplingParams(temperature=0, max_tokens=4))
    assert len(plain.token_ids) == 4
    c = build.regex("[0-9]{3}", reasoning=False, markers=Markers(THINK_END, DSML))
    with pytest.raises(ValueError, match="error loading tokenizer"):
        llm.generate(["Digits:"], SamplingParams(temperature=0, max_tokens=8), constraints=c)


def test_the_greedy_heads_masked_settle_equals_masked_fp32_logits(llm, monkeypatch):
    """Long free strings keep most of the vocabulary allowed, so a refused argmax is settled
    again from the low-precision head's approximate logits under the mask: the tokens equal
    those of the fp32 head, whose refused rows take their whole fp32 logits row, masked."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 60}, "b": {"type": "string"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    constraint = build.json_schema(schema)
    prompts = [[5 + i, 17, 300 + 11 * i] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=48)
    runs = {}

    def settled() -> int:
        masks = llm.engine.runner.masks  # (made by the first constrained step)
        return 0 if masks is None else masks.settled

    for head in ("bf16", "fp32"):
        monkeypatch.setenv("DEEPRING_GREEDY_HEAD", head)
        before = settled()
        outs = llm.generate(prompts, params, constraints=constraint)
        runs[head] = ([o.token_ids for o in outs], settled() - before)
    assert runs["bf16"][0] == runs["fp32"][0]
    assert runs["bf16"][1] > 0  # the masked settle answered rows
    assert runs["fp32"][1] == 0


def test_lazy_greedy_masks_equal_the_full_masked_logits(llm):
    """On CPU a greedy row whose grammar allowed its last argmax is not masked ahead: its new
    argmax is validated by the matcher; a refused one walks its largest approximate logits
    with the matcher, and only where that cannot settle it computes its mask. The tokens
    equal those of the full path (logprobs ask for every row's whole logits, masked ahead,
    then the argmax), and fewer masks are computed than rows decoded."""
    schema = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "minItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 0, "maximum": 999},
                        "name": {"type": "string", "maxLength": 12},
                    },
                    "required": ["id", "name"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["rows"],
        "additionalProperties": False,
    }
    constraint = build.json_schema(schema)
    prompts = [[5 + i, 17, 300 + 11 * i] for i in range(6)]
    lazy = SamplingParams(temperature=0, max_tokens=96)
    full = SamplingParams(temperature=0, max_tokens=96, logprobs=0)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2), constraints=constraint)
    masks = llm.engine.runner.masks
    before = (masks.computed, masks.late, masks.walked)
    got = llm.generate(prompts, lazy, constraints=constraint)
    computed, late = masks.computed - before[0], masks.late - before[1]
    walked = masks.walked - before[2]
    want = llm.generate(prompts, full, constraints=constraint)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    decoded = sum(len(o.token_ids) for o in got)
    assert late > 0  # refused argmaxes computed their masks after the model ran
    assert walked > 0  # and others were settled by the walk, without a mask
    assert computed < decoded, (computed, decoded)  # allowed argmaxes computed none
    for o in got:  # each output is a prefix of a valid document (the budget may cut it)
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(llm.tokenizer.decode(o.token_ids[:-1])), schema)
