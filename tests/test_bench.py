"""The benchmark's bookkeeping: rounds share the inputs out, pool back, and ratios point the right way."""

from __future__ import annotations

import json

import orjson
import pytest

from bench.run import ROUNDS, Rounds, Run, pooled, ratio, rerank_bodies, rerank_pairs, share


def test_the_rounds_share_every_input_out_once_in_order() -> None:
    items = list(range(20))
    shares = [share(items, round_) for round_ in range(ROUNDS)]
    assert [x for part in shares for x in part] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_pooled_rounds_add_their_items_time_and_latencies() -> None:
    runs = [Run("a", 10, 2.0, [0.1, 0.3], 0), Run("a", 30, 3.0, [0.2], 1)]
    total = pooled(runs)
    assert (total.name, total.sentences, total.seconds, total.errors) == ("a", 40, 5.0, 1)
    assert total.rate == 8.0
    assert sorted(total.latencies) == [0.1, 0.2, 0.3]
    assert total.percentile(50) == 200.0  # milliseconds


def test_ratios_compare_rates_or_median_latencies() -> None:
    faster = Run("x", 30, 1.0, [0.010, 0.020, 0.030])
    slower = Run("y", 20, 1.0, [0.040, 0.050, 0.060])
    assert ratio(faster, slower, "a") == 1.5  # a rate: above 1 is better
    assert ratio(faster, slower, "idle") == 0.4  # a p50: below 1 is better
    assert ratio(faster, slower, "c") == 0.4


def test_rounds_keep_each_party_and_case_round_by_round() -> None:
    rounds = Rounds()
    for round_ in range(ROUNDS):
        rounds.add("service", "a", Run("a", 10 * (round_ + 1), 1.0))
        rounds.add("reference", "a", Run("a", 10, 1.0))
    assert [run.sentences for run in rounds.runs["service"]["a"]] == [10, 20, 30]
    assert rounds.pooled("service")["a"].sentences == 60
    assert rounds.pooled("peer") == {}


def test_the_reference_reranks_the_pairs_the_service_is_sent() -> None:
    sentences = [f"sentence {i}" for i in range(100)]
    bodies, pairs = rerank_bodies(sentences), rerank_pairs(sentences)
    assert len(bodies) == len(pairs) == 3  # queries 0, 33 and 66, each with the next 32
    assert pairs[1] == [("sentence 33", f"sentence {i}") for i in range(34, 66)]
    for body, request in zip(bodies, pairs):
        sent = orjson.loads(body)
        assert [(sent["query"], document) for document in sent["documents"]] == request


def test_the_report_gives_each_ratio_pooled_and_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.run

    monkeypatch.setattr(bench.run, "machine", lambda: "a test machine")
    monkeypatch.setattr(bench.run, "cpu_flags", lambda: "none")
    monkeypatch.setattr(bench.run, "peer_version", lambda: "0.0")
    rounds = Rounds()
    for case in ("a", "b", "idle", "d", "c", "e"):
        for served in (10, 20, 30):  # texts a second in rounds 1, 2, 3; the reference 20 in each
            rounds.add("service", case, Run(case, served, 1.0, [0.010]))
            rounds.add("reference", case, Run(case, 20, 1.0, [0.020]))
    for case in ("e", "b", "idle", "d"):
        rounds.add("peer", case, Run(f"peer {case}", 5, 1.0, [0.040]))
    text = bench.run.report(rounds, "CPU", "make bench-peers", False, "on cpu", "memory")
    a_row = "| (a) HTTP rate ÷ sentence-transformers in-process (20/s) | 1.00 | 0.50, 1.00, 1.50 | 0.25 | ≥ 1.0 |"
    assert a_row in text  # the peer's 5/s in the rounds of (e), against the reference's 20
    assert "one text (20.0 ms) | 0.50 | 0.50, 0.50, 0.50 | 2.00 | ≤ 1.0 |" in text
    assert "in-process (20 ms) | 0.50 | 0.50, 0.50, 0.50 | — | ≤ 0.1 |" in text  # (c): no peer
    assert text.index("infinity-emb: peer e") < text.index("infinity-emb: peer b") < text.index("infinity-emb: peer d")


def test_a_benchmark_replaces_its_own_section_of_its_file_and_keeps_the_rest(tmp_path) -> None:
    """A file of docs/benchmarks keeps its introduction and every other section where they are; the section written
    takes the place of the one of its title, or goes last; make bench's file gets its header anew."""
    from bench.run import MAKE_BENCH, MAKE_BENCH_HEADER, write_benchmarks

    path = tmp_path / "topic.md"
    path.write_text("# Topic\n\nWhat this file holds.\n\n## One (CPU)\n\nold\n\n## Two\n\nkept\n")
    write_benchmarks("## One (CPU)\n\nnew\n", "One (CPU)", path)
    write_benchmarks("## Three\n\nadded\n", "Three", path)
    expected = "# Topic\n\nWhat this file holds.\n\n## One (CPU)\n\nnew\n\n## Two\n\nkept\n\n## Three\n\nadded\n"
    assert path.read_text() == expected
    write_benchmarks("## Two\n\nagain\n", "Two", path, header="# Header\n\n")
    assert path.read_text() == "# Header\n\n## One (CPU)\n\nnew\n\n## Two\n\nagain\n\n## Three\n\nadded\n"
    assert MAKE_BENCH.read_text().startswith(MAKE_BENCH_HEADER + "## CPU\n")  # as make bench writes it


@pytest.mark.slow
def test_the_decoder_benchmark_times_the_same_computation_in_both_libraries(tmp_path) -> None:
    """bench.decoders' checkpoint (Qwen3-0.6B's shape, one layer here) read by our loader and by transformers: the
    same last hidden states on the real tokens of a padded batch, so that its two timings are of one computation."""
    import torch
    from transformers import AutoModel

    from bench.decoders import QWEN3_06B, batches, write_qwen3
    from model import load_model

    directory = write_qwen3(tmp_path / "qwen3", layers=1)
    ours = load_model(directory, device="cpu", dtype="float32")
    assert (ours.card.config.d_model, ours.card.config.kv_heads, ours.card.config.head_dim) == (1024, 8, 128)
    assert ours.card.config.vocab_size == QWEN3_06B["vocab_size"] and ours.card.config.causal
    # the rotary base also where transformers before 5 reads it (optimum-intel's environment in --peers)
    assert json.loads((directory / "config.json").read_text())["rope_theta"] == ours.card.config.rope_theta == 1e6
    theirs = AutoModel.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa").eval()
    (inputs,) = batches(directory, ["A short text.", "A longer text, with more words than the first one has."], 2)
    mask = inputs[1].bool()
    assert not mask.all(), "the batch must hold padding"
    with torch.inference_mode():
        mine = ours.last_hidden_state(*inputs)
        reference = theirs(input_ids=inputs[0], attention_mask=inputs[1]).last_hidden_state
    torch.testing.assert_close(mine[mask], reference[mask], atol=1e-4, rtol=1e-4)


def test_top10_agreement_counts_the_neighbours_both_find() -> None:
    """One query (row 0) among 11 texts on a circle: its 10 nearest are all but the farthest. Moving one text
    from the farthest to the nearest place changes one of the ten: agreement 0.9."""
    import numpy as np

    from bench.accuracy import top10_agreement

    angles = np.linspace(0.0, 3.0, 12)  # row 0 the query, rows 1 to 11 ever farther from it
    reference = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    assert top10_agreement(reference, reference, queries=1) == 1.0
    moved = reference.copy()
    moved[11] = moved[0]  # the farthest text becomes the nearest: text 10 drops out of the ten
    assert top10_agreement(moved, reference, queries=1) == 0.9


def test_accuracy_cells_are_least_and_mean_cosine_and_top10() -> None:
    """120 texts along the axes (the first 100 the queries): identical, every cell 1; one text turned to cosine
    0.6 of its place (toward an axis no other text lies on), the least cosine 0.6 and the mean (119 + 0.6) / 120."""
    import numpy as np

    from bench.accuracy import accuracy_cells

    reference = np.eye(121, dtype=np.float64)[:120]  # unit vectors, the 121st axis left free
    assert accuracy_cells(reference, reference) == "1.000000 | 1.000000 | 1.000"
    moved = reference.copy()
    moved[5] = 0.6 * reference[5] + 0.8 * np.eye(121)[120]
    least, mean, _ = accuracy_cells(moved, reference).split(" | ")
    assert (least, mean) == ("0.600000", f"{(119 + 0.6) / 120:.6f}")


def test_the_int8_benchmark_wraps_a_converted_model_as_the_service_runs_it(tiny_model) -> None:
    """bench.int8 builds its passes around models it quantized itself: unquantized, such a pass answers as the
    loader's own OpenVINO float32 pass (it once lacked an attribute the pass had gained, and failed at its first
    call)."""
    pytest.importorskip("openvino")
    import torch

    from bench.int8 import packed_pass
    from model.runtime.loader import compile_openvino, example_batch
    from model.runtime.openvino_pass import convert

    batch = example_batch(tiny_model)
    ours = packed_pass(tiny_model.passes, convert(tiny_model.passes, batch), "f32", 1)
    loaders = compile_openvino(tiny_model, 1, torch.float32)
    hidden = ours(*batch)
    assert hidden is not None and hidden.dtype == torch.float32 and hidden.shape[:2] == batch[0].shape
    torch.testing.assert_close(hidden, loaders(*batch), rtol=0, atol=1e-6)


def test_the_int8_benchmark_compiles_with_the_properties_a_scheme_sets(tiny_model) -> None:
    """The weights-alone schemes that set OpenVINO's dynamic quantization otherwise reach the compiled pass, and each
    quantizes a copy: NNCF's weight compression changes the model it is given, which would have put int8 weights
    under every later scheme."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")

    from bench.int8 import DYNAMIC_GROUPS, packed_pass, schemes
    from model.runtime.loader import example_batch
    from model.runtime.openvino_pass import convert

    converted = convert(tiny_model.passes, example_batch(tiny_model))
    made = schemes(converted, [])
    weights = {str(op.get_output_element_type(0)) for op in converted.get_ops() if op.get_type_name() == "Constant"}
    for name, group in DYNAMIC_GROUPS.items():
        quantized = made[name]()
        ours = packed_pass(tiny_model.passes, quantized, "f32", 1, DYNAMIC_QUANTIZATION_GROUP_SIZE=group)
        assert int(ours.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == group
        assert any("uint8" in str(op.get_output_element_type(0)) for op in quantized.get_ops())
    assert not any("uint8" in t for t in weights)
    assert weights == {
        str(op.get_output_element_type(0)) for op in converted.get_ops() if op.get_type_name() == "Constant"
    }, "the converted model itself was changed"


def test_the_grpc_floor_drives_a_bare_servicer_with_the_services_loads() -> None:
    """bench.grpc --floor: the bare servicer answers Embed and every message of EmbedStream, as the loads count them."""
    import asyncio

    from bench.grpc import BareEmbed, grpc_load, start_bare
    from bench.run import free_port

    port = free_port()
    bare = start_bare(port)
    try:
        for per_request, clients in ((1, 4), (32, 2)):
            answered, seconds = asyncio.run(
                grpc_load(f"127.0.0.1:{port}", ["a text", "another"], per_request, clients, 0.3)
            )
            assert answered > 0 and answered % per_request == 0 and seconds > 0
    finally:
        bare.terminate()
        bare.wait(30)
    assert len(BareEmbed.VECTOR) == 32


def test_the_http_load_sums_what_its_client_processes_sent_and_got() -> None:
    """bench.http_load: the clients are dealt out to the processes, every request's texts counted once, and a body
    the server refuses counted as an error, not as texts."""
    import multiprocessing

    import orjson

    from bench.frontend import start_route
    from bench.http_load import Load, bodies_of, drive_processes, measured
    from bench.run import free_port

    port = free_port()
    route = start_route(port)
    texts = [f"text {i}" for i in range(64)]
    try:
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            figures, spent = measured(pool, route.pid, port, bodies_of(texts, 4, 20), Load("3 × 4", 3, 4), 2, 0.5)
            assert figures.requests > 0 and figures.texts == 4 * figures.requests and figures.errors == 0
            assert len(figures.latencies) == figures.requests and figures.seconds > 0
            # the route is one process, not an engine: its CPU counts as a front end's; the clients' is their own
            assert spent.engine_cores == 0 and spent.front_end_cores > 0.05 and spent.client_cores > 0.05
            assert 0 < spent.host_busy <= 1 and spent.front_ends_us_a_text > 0 and spent.loop_us_a_request == 0
            refused = [orjson.dumps({"texts": 7})] * 50  # not texts: 422 from the route
            bad = drive_processes(pool, port, refused, Load("1 × 1", 1, 1), 2, 0.3)
            assert bad.texts == 0 and bad.errors == bad.requests > 0
    finally:
        route.terminate()
        route.wait(30)
    assert [orjson.loads(body)["texts"] for body in bodies_of(["a", "b", "c", "d", "e"], 2, 2)] == [
        ["a", "b"],
        ["c", "d"],
    ] * 2


def test_services_taking_turns_read_their_settings_checkout_and_loads() -> None:
    from pathlib import Path

    from bench.run import ROOT
    from bench.turns import parse_load, parse_spec

    assert parse_spec("ENCODER_DTYPE=int8,ENCODER_COMPUTE_LANES=1@/tmp/before") == (
        {"ENCODER_DTYPE": "int8", "ENCODER_COMPUTE_LANES": "1"},
        Path("/tmp/before"),
    )
    assert parse_spec("ENCODER_DTYPE=a=b") == ({"ENCODER_DTYPE": "a=b"}, ROOT)
    assert parse_spec("") == ({}, ROOT)
    assert parse_load("4x32") == (4, 32) and parse_load("32X1") == (32, 1)


def test_the_host_benchmark_sends_rerank_bodies_of_a_query_and_its_documents() -> None:
    from bench.host import RERANK_LOADS, request_bodies

    sentences = [f"sentence {i}" for i in range(100)]
    (n, _, _) = RERANK_LOADS["8 clients × (1 query, 32 documents)"]
    bodies = request_bodies(sentences, n, rerank=True)
    first, second = orjson.loads(bodies[0]), orjson.loads(bodies[1])
    assert first == {"query": "sentence 0", "documents": [f"sentence {i}" for i in range(1, 33)]}
    assert second["query"] == "sentence 33" and len(second["documents"]) == 32
    assert len(bodies) == 3 * 400  # as many whole requests as the sentences make, over and over
    assert orjson.loads(request_bodies(sentences, 2, rerank=False)[1]) == {"texts": ["sentence 2", "sentence 3"]}


def test_a_threads_cpu_time_is_its_own_and_the_process_holds_every_threads() -> None:
    """bench.host's engine loop figure: the main thread's CPU read apart from the process's, which a busy other
    thread adds to and the main thread's does not."""
    import os
    import threading
    import time

    from bench.run import cpu_seconds

    pid = os.getpid()
    process_before, main_before = cpu_seconds(pid), cpu_seconds(pid, thread=pid)

    def burn() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass

    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    process, main = cpu_seconds(pid) - process_before, cpu_seconds(pid, thread=pid) - main_before
    assert process >= 0.25 and main < process - 0.2
