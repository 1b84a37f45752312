"""Every kind of bad input in API.md's error table: its status, its envelope, and the service still serving."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, serve

LIMITS = Settings(max_batch_texts=3, max_body_bytes=4096, max_attention_values=6 * 12 * 20 * 20)


@pytest.fixture(scope="module")
async def limited(bundled_model: TextEncoder) -> AsyncIterator[httpx.AsyncClient]:
    """The bundled model behind small limits, so each one can be crossed cheaply."""
    async with serve(LIMITS, bundled_model) as client:
        yield client


ENCODE_422 = [
    # (request body, param, words the message must contain)
    ({"texts": ["fine", "", "fine"]}, "texts[1]", "must not be empty"),  # an empty text
    ({"texts": ""}, "texts[0]", "must not be empty"),  # an empty single string
    ({"texts": []}, "texts", "at least 1"),  # no texts at all
    ({"texts": ["a", "b", "c", "d"]}, "texts", "at most 3 texts"),  # over max_batch_texts
    ({"texts": ["ok", "word " * 300], "truncate": False}, "texts[1]", "302 tokens, more than the maximum of 256"),
    ({"texts": "x", "layer": 7}, "layer", "between -7 and 6"),  # layer out of range
    ({"texts": "x", "layer": -8}, "layer", "between -7 and 6"),
    ({"texts": "x", "pooling": "median"}, "pooling", "'mean', 'cls', 'max', 'lasttoken'"),  # unknown pooling
    ({"texts": "x", "encoding_format": "hex"}, "encoding_format", "'float', 'base64', 'binary' or 'ubinary'"),
    ({"texts": 5}, "texts", "must be a string or a list of strings"),  # wrong type
    ({"texts": ["a", 5]}, "texts[1]", "valid string"),  # wrong item type
    ({"texts": "x", "normalize": "yes"}, "normalize", "valid boolean"),  # strings are not booleans
    ({"texts": "x", "layer": 1.5}, "layer", "valid integer"),
    ({"texts": "x", "normalise": False}, "normalise", "unknown field"),  # a misspelt option
    ({}, "texts", "field required"),  # the required field missing
]


@pytest.mark.parametrize(("body", "param", "words"), ENCODE_422)
async def test_encode_rejects_bad_input_with_422(limited: httpx.AsyncClient, body, param, words) -> None:
    assert_error(await limited.post("/encode", json=body), 422, "validation_error", param, words)


ATTENTION_422 = [
    ({"text": ""}, "text", "must not be empty"),
    ({"text": "x", "text_pair": ""}, "text_pair", "must not be empty"),
    ({"text": "x", "layers": []}, "layers", "at least 1"),  # an empty selection
    ({"text": "x", "layers": [6]}, "layers[0]", "6 is out of range: there are 6"),
    ({"text": "x", "layers": [0, -7]}, "layers[1]", "-7 is out of range"),
    ({"text": "x", "heads": [12]}, "heads[0]", "12 is out of range: there are 12"),
    ({"text": "x", "heads": []}, "heads", "at least 1"),
    ({"text": "x", "aggregate": "sum"}, "aggregate", "'none', 'mean' or 'rollout'"),
    ({"text": "x", "decimals": 9}, "decimals", "less than or equal to 8"),
    ({"text": "x", "decimals": -1}, "decimals", "greater than or equal to 0"),
    ({"text": "word " * 300, "truncate": False}, "text", "302 tokens, more than the maximum of 256"),
    ({"text": "word " * 40}, "layers", "select fewer layers or heads"),  # response over max_attention_values
    ({"text": ["a"]}, "text", "valid string"),
]


@pytest.mark.parametrize(("body", "param", "words"), ATTENTION_422)
async def test_attention_rejects_bad_input_with_422(limited: httpx.AsyncClient, body, param, words) -> None:
    assert_error(await limited.post("/attention", json=body), 422, "validation_error", param, words)


async def test_a_request_too_large_for_all_layers_fits_once_narrowed(limited: httpx.AsyncClient) -> None:
    text = "word " * 40
    assert (await limited.post("/attention", json={"text": text})).status_code == 422
    assert (await limited.post("/attention", json={"text": text, "aggregate": "mean"})).status_code == 200


PE_422 = [
    ({"length": 0}, "length", "greater than or equal to 1"),
    ({"length": "abc"}, "length", "valid integer"),
    ({"length": 8193}, "length", "at most 8192"),
    ({"d_model": 5}, "d_model", "must be even"),
    ({"d_model": 8192}, "d_model", "at most 4096"),
    ({"length": 8192, "d_model": 4096}, "length", "more than the limit"),
    ({"base": 1}, "base", "greater than 1"),
    ({"base": "inf"}, "base", "finite"),
    ({"base": "nan"}, "base", "finite"),
    ({"kind": "alibi"}, "kind", "'sinusoidal', 'learned', 'rotary' or 'relative'"),
    ({"kind": "learned", "length": 513}, "length", "at most 512"),
]


@pytest.mark.parametrize(("params", "param", "words"), PE_422)
async def test_positional_encoding_rejects_bad_query_parameters(
    limited: httpx.AsyncClient, params, param, words
) -> None:
    assert_error(await limited.get("/positional-encoding", params=params), 422, "validation_error", param, words)


async def test_tokenize_rejects_mismatched_pairs(limited: httpx.AsyncClient) -> None:
    response = await limited.post("/tokenize", json={"texts": ["a", "b"], "text_pair": ["c"]})
    assert_error(response, 422, "validation_error", "text_pair", "has 1 entry for 2 texts")
    response = await limited.post("/tokenize", json={"texts": ["a"], "text_pair": ["c", "d"]})
    assert_error(response, 422, "validation_error", "text_pair", "has 2 entries for 1 text")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"texts": ', "malformed JSON"),  # cut short
        (b"not json at all", "malformed JSON"),
        (b"", "request body is required"),  # no body
        (b"[1, 2]", "the body must be a JSON object"),  # JSON, but not an object
        (b'"texts"', "the body must be a JSON object"),
        (b'{"texts": "\xff\xfe"}', "malformed JSON"),  # not UTF-8
        (b"[" * 3_000, "malformed JSON body: it is nested too deeply to parse"),  # not "not UTF-8"
    ],
)
async def test_malformed_bodies_are_422(limited: httpx.AsyncClient, content: bytes, words: str) -> None:
    """The body as a whole: its param is ``body`` (every 422 names one)."""
    response = await limited.post("/encode", content=content, headers={"content-type": "application/json"})
    assert_error(response, 422, "validation_error", "body", words)


@pytest.mark.parametrize(
    ("path", "body", "content_type", "says"),
    [
        ("/encode", b'{"texts": ["a"]}', "application/x-www-form-urlencoded", "is 'application/x-www-form-urlencoded'"),
        ("/v1/embeddings", b'{"input": "a"}', "text/plain", "Content-Type is 'text/plain'"),
        ("/attention", b'{"text": "a"}', None, "this request has none"),
    ],
)
async def test_a_json_body_not_declared_as_json_is_422_naming_the_content_type(
    limited: httpx.AsyncClient, path: str, body: bytes, content_type: str | None, says: str
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    request = limited.build_request("POST", path, content=body, headers=headers)
    assert request.headers.get("content-type") == content_type
    response = await limited.send(request)
    error = assert_error(response, 422, "validation_error", "body", "sent with Content-Type: application/json")
    assert error["message"].endswith(says), error
    for declared in ("application/json", "application/json; charset=utf-8", "application/vnd.example+json"):
        response = await limited.post(path, content=body, headers={"content-type": declared})
        assert response.status_code == 200, (declared, response.text)


async def test_unknown_route_is_404_and_wrong_method_is_405(limited: httpx.AsyncClient) -> None:
    assert_error(await limited.get("/embeddings"), 404, "not_found", None, "/embeddings")
    response = await limited.get("/encode")
    assert_error(response, 405, "method_not_allowed", None, "GET")
    assert "POST" in response.headers["allow"]
    assert_error(await limited.delete("/attention"), 405, "method_not_allowed")
    # every method the path takes, where two routes share it (/health's GET and HEAD)
    for path, allowed in (("/health", "GET, HEAD"), ("/ready", "GET, HEAD"), ("/info", "GET")):
        response = await limited.put(path)
        assert_error(response, 405, "method_not_allowed", None, "PUT")
        assert response.headers["allow"] == allowed, (path, response.headers)
    tei = await limited.put("/tei/health")  # in TEI's shape, as its routes answer
    assert (tei.status_code, tei.headers["allow"]) == (405, "GET, HEAD"), tei.headers


async def test_an_error_takes_the_shape_of_the_api_its_route_or_its_prefix_belongs_to(
    limited: httpx.AsyncClient,
) -> None:
    """Each API's routes answer errors in its shape, the framework's own (405, a body that is no JSON) too; a path
    that no route serves, in the shape of the API whose prefix it is under; elsewhere ours."""
    tei = await limited.get("/tei/embed")  # the route's, for a method it does not take
    assert (tei.status_code, tei.json()) == (
        405,
        {"error": "method GET is not allowed on /tei/embed", "error_type": "Validation"},
    )
    malformed = await limited.post("/v2/embed", content=b"{", headers={"content-type": "application/json"})
    assert malformed.status_code == 422 and list(malformed.json()) == ["message"], malformed.text
    assert malformed.json()["message"].startswith("malformed JSON body")
    for path, body in (
        ("/tei/nothing", {"error": "no route /tei/nothing", "error_type": "Validation"}),
        ("/models/a/b/tei/nothing", {"error": "no route /models/a/b/tei/nothing", "error_type": "Validation"}),
        ("/v2/nothing", {"message": "no route /v2/nothing"}),
        ("/v2", {"message": "no route /v2"}),  # Cohere's prefix itself
    ):
        response = await limited.get(path)
        assert (response.status_code, response.json()) == (404, body), path
    assert_error(await limited.get("/teidings"), 404, "not_found", None, "/teidings")  # a prefix is a whole segment
    jina = await limited.post("/v1/rerank", content=b"{", headers={"content-type": "application/json"})
    assert_error(jina, 422, "validation_error", "body", "malformed JSON")  # Jina's rerank answers in ours


async def test_body_over_the_limit_is_413_before_parsing(limited: httpx.AsyncClient) -> None:
    body = b'{"texts": "' + b"a" * 5000 + b'"}'
    response = await limited.post("/encode", content=body, headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large", None, "limit is 4,096 bytes")
    # not valid JSON at all: still 413, since the size is checked before anything is parsed
    response = await limited.post("/encode", content=b"{" * 5000, headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large")


async def test_chunked_body_over_the_limit_is_413(limited: httpx.AsyncClient) -> None:
    async def chunks():
        yield b'{"texts": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    response = await limited.post("/encode", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large")


async def test_chunked_body_under_the_limit_is_served(limited: httpx.AsyncClient) -> None:
    async def chunks():
        yield b'{"texts": '
        yield b'"hello"}'

    response = await limited.post("/encode", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 200 and len(response.json()["data"]) == 1


async def test_service_keeps_serving_after_every_kind_of_bad_input(limited: httpx.AsyncClient) -> None:
    for body, _, _ in ENCODE_422:
        await limited.post("/encode", json=body)
    for body, _, _ in ATTENTION_422:
        await limited.post("/attention", json=body)
    await limited.post("/encode", content=b"{" * 5000)
    assert (await limited.get("/health")).status_code == 200
    response = await limited.post("/encode", json={"texts": ["still", "serving"]})
    assert response.status_code == 200 and len(response.json()["data"]) == 2


def test_every_engine_error_crosses_to_a_front_end_whole() -> None:
    """The engine sends a failed task's error itself (pickled) and the front end raises it as it is: its class,
    message and Retry-After, whatever its constructor takes."""
    import pickle

    from app.engine import errors
    from app.engine.work_queue import QueueClosed

    sent = [
        errors.QueueFull("the queue is full", retry_after_s=2),
        errors.EngineStopped("the engine stopped; the service is restarting"),
        errors.DeadlinePassed("the request was not answered in time"),
        errors.ComputeFailed("the model failed to compute this request"),
        QueueClosed(),  # a constructor without arguments
    ]
    for error in sent:
        received = pickle.loads(pickle.dumps(error))
        assert type(received) is type(error)
        assert (received.message, received.retry_after_s) == (error.message, error.retry_after_s)
        assert str(received) == str(error)
    assert (sent[-1].message, sent[-1].retry_after_s) == ("the service is shutting down", 1)


def test_each_engine_error_is_worded_as_the_clients() -> None:
    """The web layer's reading of the engine's errors: API.md's types and statuses, Retry-After where there is one."""
    from app import errors
    from app.engine import errors as engine
    from app.web.responding import client_error

    cases = [
        (engine.QueueFull("full", retry_after_s=3), errors.Overloaded, 429, "overloaded", {"Retry-After": "3"}),
        (engine.EngineStopped("gone"), errors.NotReady, 503, "not_ready", None),
        (engine.DeadlinePassed("late"), errors.Timeout, 503, "timeout", None),
        (engine.ComputeFailed("failed"), errors.InferenceFailed, 503, "inference_failed", None),
    ]
    for error, kind, status, type_, headers in cases:
        worded = client_error(error)
        assert type(worded) is kind and (worded.status_code, worded.type) == (status, type_)
        assert worded.message == error.message and worded.headers == headers


def test_api_errors_name_what_they_concern() -> None:
    from app import errors

    missing = errors.ModelNotFound("nobody", ["minilm", "tiny"])
    assert (missing.param, missing.message) == (
        "model",
        "model: no model named 'nobody' is served (served: minilm, tiny)",
    )
    lacks = errors.ModelLacks("minilm", "sparse output", "sparse")
    assert (lacks.param, lacks.message) == ("model", "model: model 'minilm' has no sparse output")


def test_naming_the_field_of_a_union_failure_warns_of_nothing() -> None:
    """The first of a union's failures names the field by the path's head: ``inputs[0][0]`` and ``inputs`` are one
    field. The pattern that cuts the head compiles without the "nested set" FutureWarning that once reached the log
    on the first refusal of each process."""
    import re
    import warnings

    from app import errors

    failures = [
        {"loc": ("body", "inputs", "str"), "msg": "input should be a valid string"},
        {"loc": ("body", "inputs", 0, 0), "msg": "input should be a valid integer"},
        {"loc": ("body", "normalize"), "msg": "input should be a valid boolean"},
    ]
    re.purge()  # compiled anew here, so a warning at compile time shows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert errors.telling(failures)["loc"] == ("body", "inputs", 0, 0)


async def test_errors_made_before_routing_take_the_shape_of_the_api_the_path_belongs_to(
    limited: httpx.AsyncClient,
) -> None:
    """The body's limit (413) and a Content-Length that is no number (400) are answered before any route is
    reached: under TEI's prefix in TEI's shape, under Cohere's in Cohere's, elsewhere ours."""
    over = b'{"inputs": "' + b"a" * 5000 + b'"}'
    json_type = {"content-type": "application/json"}
    for path in ("/tei/embed", "/models/a/tei/embed"):
        response = await limited.post(path, content=over, headers=json_type)
        assert response.status_code == 413, (path, response.text)
        assert response.json() == {
            "error": "request body is 5,014 bytes; the limit is 4,096 bytes",
            "error_type": "Validation",
        }, path
    cohere = await limited.post("/v2/embed", content=over, headers=json_type)
    assert (cohere.status_code, cohere.json()) == (
        413,
        {"message": "request body is 5,014 bytes; the limit is 4,096 bytes"},
    )
    assert_error(await limited.post("/encode", content=over, headers=json_type), 413, "payload_too_large")
    bad_length = {**json_type, "content-length": "many"}
    tei = await limited.post("/tei/embed", content=b"{}", headers=bad_length)
    assert (tei.status_code, tei.json()) == (
        400,
        {"error": "invalid Content-Length header", "error_type": "Validation"},
    )
    assert_error(await limited.post("/encode", content=b"{}", headers=bad_length), 400, "bad_request")
