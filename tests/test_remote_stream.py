"""Streamed chunks of llama-server and vLLM → token events, checked against numbers worked out here.

The llama-server chunks are copied from what its source writes (tools/server/server-task.cpp:
``probs_vector_to_json``, ``to_json_oaicompat_chat``; server-context.cpp: ``populate_token_probs``, ``process_token``
for the byte merge, the speculative accept loop for tokens without probabilities) and were seen from the real server.
The vLLM chunks are written from vLLM's documented schema (``ChatCompletionLogProbsContent``: token, logprob, bytes,
top_logprobs, no ids; the sampled token first in its top list; the legacy completions ``tokens`` /
``token_logprobs`` / ``top_logprobs`` dicts): vLLM cannot be installed on these machines, so they are LABELLED as
written from the schema, not captured.
"""

from __future__ import annotations

import json
import math

import pytest

from playground.config import ConfigError, RunSettings
from playground.events import Candidate, dumps_event, event_from_dict
from playground.events.remote import RemoteStarted, RemoteTokenStep
from playground.remote.branch import RemoteBranch
from playground.remote.client import EngineInfo, parse_metrics
from playground.remote.errors import RemoteError
from playground.remote.request import build_request
from playground.remote.source import RemoteSource
from playground.remote.stream import (
    MalformedChunk,
    MissingLogprobs,
    StreamFormat,
    chunk_parts,
    chunk_steps,
    entry_step,
)

LLAMA = StreamFormat(engine="llama.cpp", top_logprobs=3)


def entropy_bits(probs: list[float]) -> float:
    return -sum(p * math.log2(p) for p in probs if p > 0)


def llama_chat_chunk(content: str, entries: list[dict] | None, timings: dict | None = None) -> dict:
    """A chat chunk as llama-server streams it (logprobs only when the token has probabilities)."""
    choice: dict = {"finish_reason": None, "index": 0, "delta": {"content": content}}
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    chunk = {"choices": [choice], "created": 1, "id": "chatcmpl-x", "model": "m.gguf",
             "system_fingerprint": "b1-0c1e570", "object": "chat.completion.chunk"}
    if timings is not None:
        chunk["timings"] = timings
    return chunk


def lp(token_id: int, text: str, logprob: float) -> dict:
    return {"id": token_id, "token": text, "bytes": list(text.encode()), "logprob": logprob}


# ---- llama-server -------------------------------------------------------------------------------------------------

def test_llama_chat_token_numbers_are_the_servers_and_rank_is_inferred():
    tops = [lp(504, "The", -0.9), lp(60, "L", -1.3), lp(15319, "La", -2.5)]
    chunk = llama_chat_chunk("L", [{**lp(60, "L", -1.3), "top_logprobs": tops}],
                             {"prompt_n": 37, "prompt_ms": 76.4, "predicted_n": 2, "predicted_ms": 6.65})
    parts = chunk_parts(chunk)
    assert parts.text == "L" and parts.timings["predicted_ms"] == 6.65 and parts.finish_reason is None
    (step,) = chunk_steps(parts, LLAMA, first_step=4, chunk_ms=6.0, had_probs=True)
    probs = [math.exp(-0.9), math.exp(-1.3), math.exp(-2.5)]
    assert isinstance(step, RemoteTokenStep)
    assert (step.step, step.token_id, step.text) == (4, 60, "L")
    assert step.prob == step.raw_prob == math.exp(-1.3) and step.logprob == -1.3
    assert step.raw_rank == 2 and step.rank_exact  # one listed token is more likely
    assert step.shown_raw_mass == pytest.approx(sum(probs), abs=1e-15)
    assert step.entropy == pytest.approx(entropy_bits(probs), abs=1e-12) == step.processed_entropy
    assert [(c.token_id, c.text, c.raw_rank) for c in step.candidates] == [(504, "The", 1), (60, "L", 2),
                                                                           (15319, "La", 3)]
    assert [c.raw_prob for c in step.candidates] == probs == [c.processed_prob for c in step.candidates]
    assert step.has_probs and step.merged_bytes == 0 and not step.forced and step.step_ms == 6.0
    assert step.kv_cache_bytes == 0 and step.effects == ()


def test_llama_role_finish_and_usage_chunks_hold_no_tokens():
    role = {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
            "object": "chat.completion.chunk"}
    finish = {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}
    usage = {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 37}, "timings": {"predicted_n": 3}}
    for chunk in (role, finish, usage):
        assert chunk_steps(chunk_parts(chunk), LLAMA, 0, 1.0, had_probs=False) == []
    assert chunk_parts(finish).finish_reason == "stop"
    assert chunk_parts(usage).usage == {"completion_tokens": 3, "prompt_tokens": 37}


def test_llama_chosen_outside_the_list_ranks_past_it():
    tops = [lp(1, "a", -0.2), lp(2, "b", -2.0)]
    step = entry_step({**lp(9, "z", -6.0), "top_logprobs": tops}, 0, StreamFormat("llama.cpp", 2))
    assert step.raw_rank == 3 and not step.rank_exact  # "> 2"
    assert step.candidates[-1] == Candidate(token_id=9, text="z", raw_prob=math.exp(-6.0),
                                            processed_prob=math.exp(-6.0), raw_rank=3)
    assert step.shown_raw_mass == pytest.approx(math.exp(-0.2) + math.exp(-2.0), abs=1e-15)  # the list only
    assert step.entropy == pytest.approx(entropy_bits([math.exp(-0.2), math.exp(-2.0), math.exp(-6.0)]))


def test_llama_byte_pieces_merged_into_one_entry():
    # Captured from llama-server on the default model: "首" is three bytes, the last token carries one of them;
    # the server held the first two pieces back (no probabilities sent) and sent one entry with the whole text.
    chunk = {"choices": [{"text": "首", "index": 0, "logprobs": {"content": [
        {"id": 240, "token": "首", "bytes": [233, 166, 150], "logprob": -0.16128017008304596,
         "top_logprobs": [{"id": 240, "token": "\ufffd", "bytes": [150], "logprob": -0.16128017008304596},
                          {"id": 243, "token": "\ufffd", "bytes": [153], "logprob": -2.06773042678833}]}]},
        "finish_reason": None}], "object": "text_completion"}
    (step,) = chunk_steps(chunk_parts(chunk), StreamFormat("llama.cpp", 2), 0, 0.0, had_probs=False)
    assert (step.token_id, step.text, step.merged_bytes) == (240, "首", 2)
    assert [c.text for c in step.candidates] == ["<0x96>", "<0x99>"]  # a piece of a character, as a local run
    assert step.raw_rank == 1 and step.prob == math.exp(-0.16128017008304596)


def test_llama_accepted_draft_tokens_come_without_probabilities():
    first = llama_chat_chunk("The", [{**lp(504, "The", -0.1), "top_logprobs": [lp(504, "The", -0.1)]}])
    draft = llama_chat_chunk(" capital", None)  # streamed: the chunk of an accepted draft token has no logprobs
    (step,) = chunk_steps(chunk_parts(first), LLAMA, 0, 1.0, had_probs=False)
    (guess,) = chunk_steps(chunk_parts(draft), LLAMA, 1, 0.0, had_probs=True)
    assert step.has_probs and not guess.has_probs
    assert (guess.step, guess.text, guess.candidates, guess.raw_rank) == (1, " capital", (), 0)
    assert guess.prob == guess.raw_prob == 0.0 and guess.logprob == float("-inf")  # never drawn as certain
    # The same token in the non-streamed shape: "probability 1.0" and an empty list (a TODO in the server).
    (placeholder,) = chunk_steps(chunk_parts(llama_chat_chunk(" capital", [
        {"id": 6500, "token": " capital", "bytes": list(b" capital"), "logprob": 0.0, "top_logprobs": []}])),
        LLAMA, 1, 0.0, had_probs=True)
    assert not placeholder.has_probs and placeholder.token_id == 6500 and placeholder.prob == 0.0


def test_a_server_that_ignores_logprobs_is_told_apart_from_draft_tokens():
    with pytest.raises(MissingLogprobs):
        chunk_steps(chunk_parts(llama_chat_chunk("Hello", None)), LLAMA, 0, 0.0, had_probs=False)


def test_llama_post_sampler_probabilities():
    # post_sampling_probs: "prob"/"top_probs" (probabilities after the sampler chain), zeros filtered out.
    entry = {"id": 7, "token": "x", "bytes": [120], "prob": 0.75,
             "top_probs": [{"id": 7, "token": "x", "bytes": [120], "prob": 0.75},
                           {"id": 8, "token": "y", "bytes": [121], "prob": 0.25}]}
    step = entry_step(entry, 0, StreamFormat("llama.cpp", 20))
    assert step.prob == 0.75 and step.logprob == math.log(0.75) and step.raw_rank == 1
    assert step.shown_raw_mass == 1.0 and step.entropy == pytest.approx(entropy_bits([0.75, 0.25]))


# ---- vLLM (written from its documented schema, not captured: vLLM cannot run here) ----------------------------------

def vllm_entry(text: str, logprob: float, tops: list[tuple[str, float]]) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in tops]}


def test_vllm_chat_chunk_several_tokens_no_ids_sampled_token_listed_first():
    # SCHEMA-WRITTEN vLLM chat chunk: two tokens in one chunk; vLLM lists the sampled token first.
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "meta-llama/x",
             "choices": [{"index": 0, "delta": {"content": " Paris is"}, "finish_reason": None, "logprobs": {
                 "content": [vllm_entry(" Paris", -0.05, [(" Paris", -0.05), (" Lyon", -3.2), (" the", -4.0)]),
                             vllm_entry(" is", -1.5, [(" is", -1.5), (",", -0.4), (".", -1.9)])]}}]}
    fmt = StreamFormat("vllm", 3)
    first, second = chunk_steps(chunk_parts(chunk), fmt, 0, chunk_ms=10.0, had_probs=False)
    assert first.token_id == -1 and [c.token_id for c in first.candidates] == [-1, -2, -3]  # no ids from vLLM
    assert first.raw_rank == 1 and first.rank_exact and first.step_ms == 5.0 == second.step_ms
    # " is" came first in the list but "," is more likely: sorted, " is" ranks 2 (the middle of a full list).
    assert [c.text for c in second.candidates] == [",", " is", "."]
    assert second.token_id == -2 and second.raw_rank == 2 and second.rank_exact


def test_vllm_sampled_token_at_the_bottom_of_a_full_list_is_a_lower_bound():
    # SCHEMA-WRITTEN: the sampled token is put first even when outside the top 3, pushing the 3rd true one out.
    step = entry_step(vllm_entry(" zebra", -7.0, [(" zebra", -7.0), (" a", -0.3), (" b", -1.7)]), 0,
                      StreamFormat("vllm", 3))
    assert step.raw_rank == 3 and not step.rank_exact


def test_vllm_partial_byte_tokens_keep_their_own_probabilities():
    # SCHEMA-WRITTEN: vLLM sends each byte piece of "中" as its own entry, text "" until the character completes.
    entries = [{"token": "", "logprob": -0.1, "bytes": [], "top_logprobs": [{"token": "", "logprob": -0.1,
                                                                             "bytes": []}]},
               {"token": "中", "logprob": -0.2, "bytes": list("中".encode()),
                "top_logprobs": [{"token": "中", "logprob": -0.2, "bytes": list("中".encode())}]}]
    chunk = {"choices": [{"index": 0, "delta": {"content": "中"}, "logprobs": {"content": entries}}]}
    steps = chunk_steps(chunk_parts(chunk), StreamFormat("vllm", 1), 0, 0.0, had_probs=False)
    assert [(s.text, s.prob, s.merged_bytes) for s in steps] == [("", math.exp(-0.1), 0), ("中", math.exp(-0.2), 0)]


def test_vllm_legacy_completions_logprobs():
    # SCHEMA-WRITTEN vLLM /v1/completions chunk: legacy logprobs; the top dict holds the sampled token and the top
    # 2 (3 entries: it is outside them); -9999.0 stands for -inf.
    chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " cat", "logprobs": {
        "text_offset": [0], "tokens": [" cat"], "token_logprobs": [-2.3],
        "top_logprobs": [{" cat": -2.3, " dog": -0.5, " the": -1.1}]}, "finish_reason": None}]}
    (step,) = chunk_steps(chunk_parts(chunk), StreamFormat("vllm", 2), 0, 0.0, had_probs=False)
    assert step.text == " cat" and step.raw_rank == 3 and not step.rank_exact
    assert [c.text for c in step.candidates] == [" dog", " the", " cat"]
    floor = entry_step({"token": "x", "logprob": -9999.0, "top_logprobs": [{"token": "y", "logprob": -0.1}]}, 0,
                       StreamFormat("vllm", 1))
    assert floor.prob == 0.0 and floor.logprob == float("-inf")


def test_malformed_chunks_say_what_is_wrong():
    with pytest.raises(MalformedChunk, match="choices"):
        chunk_parts({"object": "chat.completion.chunk"})
    with pytest.raises(MalformedChunk, match="JSON object"):
        chunk_parts(["not", "a", "chunk"])
    with pytest.raises(MalformedChunk, match="logprob must be at most 0"):
        entry_step({"token": "x", "logprob": 0.5, "top_logprobs": []}, 0, LLAMA)
    with pytest.raises(MalformedChunk, match="token must be a string"):
        entry_step({"token": 5, "logprob": -0.5}, 0, LLAMA)


# ---- events, request, branch, metrics ---------------------------------------------------------------------------

def test_remote_events_round_trip_through_json():
    step = entry_step({**lp(9, "z", -6.0), "top_logprobs": [lp(1, "a", -0.2)]}, 0, LLAMA)
    started = RemoteStarted(engine="llama.cpp", engine_version="b1", base_url="http://h/v1", model="m",
                            endpoint="completions", distribution="raw", distribution_note="n", top_logprobs=3,
                            timings="server", n_ctx=4096, speculative=True, api_key_env="KEY_VAR",
                            model_meta={"n_params": 1, "ftype": "Q4_1"}, missing=("ranks",))
    no_probs = chunk_steps(chunk_parts(llama_chat_chunk("x", None)), LLAMA, 1, 0.0, had_probs=True)[0]
    for event in (step, started, no_probs):
        line = dumps_event(event)
        assert event_from_dict(json.loads(line)) == event


def test_request_greedy_and_sampling_in_each_engines_words():
    llama = EngineInfo(engine="llama.cpp", version="b1", models=("m",), n_ctx=4096)
    source = RemoteSource(base_url="http://h:1/v1")
    greedy = build_request(RunSettings(num_candidates=5), llama, "m", source)
    assert greedy.endpoint == "chat/completions" and greedy.top_logprobs == 5
    assert greedy.kwargs["temperature"] == 0.0 and greedy.kwargs["logprobs"] is True
    assert greedy.kwargs["extra_body"] == {"samplers": ["penalties", "temperature", "top_k", "top_p", "min_p"],
                                           "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                                           "timings_per_token": True}
    sample = build_request(RunSettings(strategy="sample", chat=False, temperature=0.7, top_k=5, top_p=0.9,
                                       min_p=0.1, seed=3, num_candidates=50), EngineInfo("vllm", "0.9", ("m",)),
                           "m", source, answer_start=" Paris")
    assert sample.kwargs["prompt"] == RunSettings().prompt + " Paris" and sample.kwargs["logprobs"] == 20
    assert (sample.kwargs["temperature"], sample.kwargs["top_p"], sample.kwargs["seed"]) == (0.7, 0.9, 3)
    assert sample.kwargs["extra_body"] == {"top_k": 5, "min_p": 0.1}
    chat_branch = build_request(RunSettings(), EngineInfo("vllm", "0.9", ("m",)), "m", source, answer_start="Hi")
    assert chat_branch.kwargs["messages"][-1] == {"role": "assistant", "content": "Hi"}
    assert chat_branch.kwargs["extra_body"] == {"continue_final_message": True, "add_generation_prompt": False}
    with pytest.raises(RemoteError, match="repetition penalty"):
        build_request(RunSettings(repetition_penalty=1.2), EngineInfo("generic", "", ("m",)), "m", source)
    with pytest.raises(RemoteError, match="llama-server option"):
        build_request(RunSettings(), EngineInfo("vllm", "", ("m",)), "m", source.replace(post_sampling_probs=True))


def test_branch_sends_text_and_reuses_the_parents_numbers():
    tops = [lp(1, " The", -0.1), lp(2, " A", -2.5)]
    parent = [entry_step({**lp(1, " The", -0.1), "top_logprobs": tops}, 0, LLAMA),
              entry_step({**lp(5, " cat", -0.3), "top_logprobs": [lp(5, " cat", -0.3), lp(6, " dog", -1.4)]}, 1,
                         LLAMA)]
    dog = parent[1].candidates[1]
    branch = RemoteBranch(tuple(parent), 1, dog).validate()
    assert branch.prefix_text() == " The dog"
    kept, forced = branch.forced_steps()
    assert kept.forced and kept.token_id == 1 and kept.prob == parent[0].prob and kept.step_ms == 0.0
    assert (forced.step, forced.token_id, forced.text, forced.raw_rank) == (1, 6, " dog", 2)
    assert forced.prob == math.exp(-1.4) and forced.logprob == pytest.approx(-1.4) and forced.forced
    with pytest.raises(ConfigError, match="part of a character"):
        RemoteBranch(tuple(parent), 1, Candidate(7, "<0xE9>", 0.1, 0.1, 3)).validate()


def test_source_settings_are_checked_and_never_hold_the_key(monkeypatch):
    with pytest.raises(ConfigError, match="http:// or https://"):
        RemoteSource(base_url="ftp://h/v1").validate()
    with pytest.raises(ConfigError, match="did you mean http://localhost:8080"):
        RemoteSource(base_url="localhost:8080").validate()
    with pytest.raises(ConfigError, match="user name or password"):
        RemoteSource(base_url="https://me:secret@h/v1").validate()
    with pytest.raises(ConfigError, match="NAME of an environment variable") as refused:
        RemoteSource(base_url="http://h/v1", api_key_env="sk-live-123").validate()
    assert "sk-live-123" not in str(refused.value)
    source = RemoteSource(base_url="http://h:8080/v1/", api_key_env="PLAYGROUND_TEST_KEY").validate()
    assert (source.root_url, source.api_url) == ("http://h:8080", "http://h:8080/v1")
    monkeypatch.delenv("PLAYGROUND_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="PLAYGROUND_TEST_KEY"):
        source.api_key()
    monkeypatch.setenv("PLAYGROUND_TEST_KEY", "k-123456")
    assert source.api_key() == "k-123456" and "k-123456" not in json.dumps(source.as_plain_dict())


def test_prometheus_metrics_are_read_per_series():
    text = ('# HELP llamacpp:n_decode_total x\nllamacpp:n_decode_total 12\n'
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7\nvllm:kv_cache_usage_perc 0.25\n')
    assert parse_metrics(text) == {"llamacpp:n_decode_total": 12.0, "vllm:kv_cache_usage_perc": 0.25,
                                   'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 7.0}


def test_model_is_resolved_on_the_server():
    llama = EngineInfo("llama.cpp", "b1", ("/models/SmolLM2.Q4_1.gguf",))
    assert llama.resolve_model("") == "/models/SmolLM2.Q4_1.gguf" == llama.resolve_model("SmolLM2.Q4_1.gguf")
    with pytest.raises(RemoteError, match="no model 'other'"):
        llama.resolve_model("other")
    with pytest.raises(RemoteError, match="serves 2 models"):
        EngineInfo("vllm", "0.9", ("a", "b")).resolve_model("")
