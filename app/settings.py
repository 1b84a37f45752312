"""Settings from environment variables (prefix ``ENCODER_``), read once through ``get_settings()``."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENCODER_", env_file=None, extra="ignore")

    model: str | None = Field(
        None,
        description="the model to serve: a Hugging Face Hub id (org/name, or org/name@revision: a branch, tag or "
        "commit), fetched into the Hugging Face cache at start (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE as "
        "huggingface_hub reads them), or a Hugging Face-layout directory; the bundled all-MiniLM-L6-v2 when unset",
    )
    model_dir: Path | None = Field(None, description="as model, a directory only (kept for older configurations)")
    model_name: str | None = Field(
        None, description="name reported in responses; the Hub id (org/name) or the directory's name when unset"
    )
    models: Annotated[list[tuple[str, str | Path]], NoDecode] = Field(
        default_factory=list,
        description="several models in one service: comma-separated name=model entries (a Hub id or a directory), "
        "the first the default; when set, model, model_dir and model_name are not used",
    )
    device: str = Field("auto", description="auto (CUDA when available, else CPU), cpu, cuda, cuda:1, …")
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8"] = Field(
        "auto",
        description="what the matrix products run in: auto = float16 on CUDA (bfloat16 for a checkpoint stored in it), "
        "float32 on a CPU (exact); bfloat16 on a CPU with AVX512-BF16 or AMX (refused elsewhere); int8 "
        "(CPU only, the int8 extra): OpenVINO's pass with the linear layers' weights in int8, the rest in bfloat16 "
        "where the CPU has it, float32 elsewhere",
    )
    runtime: Literal["auto", "torch", "openvino"] = Field(
        "auto",
        description="what computes the embedding pass on a CPU: openvino (the pass compiled by OpenVINO), torch, or "
        "auto: by a stated rule of the CPU kind, the model and the precision (docs/operations.md, 'Runtime and "
        "precision': a decoder or a small encoder on torch; an encoder on OpenVINO with AVX-512 and no AMX, on "
        "torch with AMX (OpenVINO taking its single texts in bfloat16) or without AVX-512), torch where OpenVINO "
        "cannot compile the model; on a GPU, torch always",
    )
    traced_pass: bool = Field(
        True,
        description="run the embedding and classification passes as a traced graph, which needs no GIL while it "
        "runs (false: eagerly, operation by operation)",
    )
    cuda_graphs: bool = Field(
        True,
        description="on a GPU, replay the embedding and classification passes (up to max_batch_tokens padded "
        "tokens) as CUDA graphs, one per bucket of batch shape, recorded at start-up (false: launch them kernel "
        "by kernel)",
    )

    max_batch_texts: int = Field(256, ge=1, description="texts per /encode or /tokenize request")
    max_tokens_per_text: int | None = Field(
        None,
        ge=2,
        description="tokens per text, special tokens included; the model's own maximum when unset "
        "(256 for all-MiniLM-L6-v2)",
    )
    max_attention_tokens: int | None = Field(
        None,
        ge=2,
        description="tokens of a text (and pair) given to /attention and /attention/heads; max_tokens_per_text when "
        "unset; at most the model's position table (512 for all-MiniLM-L6-v2)",
    )
    max_attention_values: int = Field(
        2_000_000, ge=1, description="attention weights in one /attention response (selected layers × heads × tokens²)"
    )
    max_attention_values_binary: int = Field(
        18_874_368,
        ge=1,
        description="attention weights in one /attention response as NumPy npz (Accept: application/x-npz); the "
        "default holds every layer and head of a 512-token text of all-MiniLM-L6-v2",
    )
    max_head_statistics_values: int = Field(
        2**28,
        ge=1,
        description="attention weights one /attention/heads request computes, summed over its texts "
        "(layers × heads × tokens²): 268,435,456, e.g. 64 texts of 240 tokens of all-MiniLM-L6-v2",
    )
    inspection_slice_values: int = Field(
        2**25,
        ge=1,
        description="attention weights held at once while /attention/heads computes (texts × layers × heads × "
        "tokens² of one slice; at least one text): what bounds its peak memory",
    )
    inspection_passes: int = Field(
        1,
        ge=1,
        description="inspection passes (/attention, /attention/heads slices) computed at once in the process, "
        "whatever the models and compute lanes; what bounds the memory they hold together. Embeddings and other "
        "passes go on beside them",
    )
    max_explanation_values: int = Field(
        2_000_000,
        ge=1,
        description="contributions in one /similarity response with explain (source tokens × text tokens, summed "
        "over the texts)",
    )
    max_explain_steps: int = Field(
        256, ge=1, description="integrated gradients' steps in one /explain request (each step a row of its passes)"
    )
    max_explained_texts: int = Field(
        16, ge=1, description="documents or texts explained in one /rerank or /classify request with explain"
    )
    max_vectors_per_request: int = Field(
        65_536,
        ge=1,
        description="token vectors one /encode/multi-vector request may return (or /rerank and /similarity compute "
        "on a multi-vector model): a text's tokens, a query's expansion included",
    )
    max_sparse_weights_per_request: int = Field(
        2_000_000,
        ge=1,
        description="non-zero weights one /encode/sparse answer may hold, summed over its texts (top_k narrows)",
    )
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="request body size, checked before parsing")
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a request whose body has not all arrived this long after it began is answered 408 "
        "request_timeout and its connection closed",
    )
    pe_max_length: int = Field(8192, ge=1, description="largest `length` of /positional-encoding")
    pe_max_d_model: int = Field(4096, ge=2, description="largest `d_model` of /positional-encoding")
    pe_max_values: int = Field(4_194_304, ge=1, description="largest length × d_model of /positional-encoding")

    max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="padded tokens (rows × longest row) in one forward pass of merged /encode work; unset: 16384 on "
        "a GPU, and on a CPU as many as keep the pass's largest activation within 24 MiB and the compute lanes' passes "
        "together within 48 MiB (all-MiniLM-L6-v2: 4096 on one or two lanes, 2730 on three, two cores' default)",
    )
    max_batch_size: int = Field(256, ge=1, description="texts in one forward pass of merged /encode work")
    memory_headroom_mib: int = Field(
        192,
        ge=0,
        description="each process hands its heap's free pages back to the system (at most once a second) while its "
        "resident memory is this many MiB above its size when ready; 0: only when the queue empties",
    )
    front_end_allocator: str = Field(
        "auto",
        min_length=1,
        description="the C allocator of the front-end processes (app.serve's, around the engine): auto, jemalloc "
        "where its library is installed (libjemalloc2), else the C library's own; glibc, the C library's own; or "
        "the path of an allocator's shared library, preloaded into them",
    )
    compute_lanes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="forward passes computed at once, each on its share of torch's threads (one that runs alone "
        "takes them all); unset: 3 on a CPU where torch has 2 threads, 2 where it has 3, else 1",
    )
    workers: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto",
        description="front-end processes (HTTP, validation, tokenisation, serialisation) around one engine process "
        "that holds the models, under `python -m app.serve`; 1: one process does everything; auto: one per 4 cores "
        "where a GPU computes (at most 8), one plus one per 16 cores on a CPU (at most 8): 1 below 16 cores",
    )
    batch_wait_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="how long an idle inference thread waits for more texts before computing a batch that has room",
    )
    max_queue_texts: int = Field(
        1024,
        ge=1,
        description="texts admitted at once (queued or computing; an /attention request counts as one); past it an "
        "immediate 429 overloaded",
    )
    request_timeout_s: float = Field(
        60.0, gt=0, description="a request not answered by then is dropped from the queue and answered 503 timeout"
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="accepted Bearer keys, comma-separated; every endpoint but /health is open when empty",
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="serve text-embeddings-inference's gRPC API (tei.v1) on this port beside HTTP, for the default "
        "model; unset: no gRPC",
    )
    grpc_host: str = Field(
        default_factory=lambda: os.environ.get("UVICORN_HOST", "127.0.0.1"),
        description="the address the gRPC API listens on (with grpc_port); by default HTTP's (--host, UVICORN_HOST)",
    )
    log_level: str = Field("info", description="logging level of the service")
    log_format: Literal["text", "json"] = Field("text", description="text, or one JSON object a line")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed to call the API from a browser, comma-separated (* for any); none by default",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        entries = []
        for entry in (part.strip() for part in value.split(",")):
            if not entry:
                continue
            name, equals, source = entry.partition("=")
            if not equals or not name.strip() or not source.strip():
                raise ValueError(f"each entry must be name=model (a Hub id or a directory), got {entry!r}")
            entries.append((name.strip(), source.strip()))
        names = [name for name, _ in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {', '.join(names)}")
        return entries

    @model_validator(mode="after")
    def _one_model_setting(self) -> Settings:
        if self.model is not None and self.model_dir is not None:
            raise ValueError("set ENCODER_MODEL or ENCODER_MODEL_DIR, not both")
        return self

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value


PREFIX = "ENCODER_"

# What Kubernetes writes for a Service whose name begins with "encoder" (and docker's links): ENCODER_SERVICE_HOST,
# ENCODER_SERVICE_PORT, ENCODER_PORT=tcp://10.0.0.1:8000, ENCODER_PORT_8000_TCP_ADDR, ... (a Service named
# encoder-service gives ENCODER_SERVICE_SERVICE_HOST and the like). They are the platform's, not misspelt settings;
# the manifests turn them off (enableServiceLinks: false) and, elsewhere, they are known by their names and values.
ADDRESS = r"(\d{1,3}(\.\d{1,3}){3}|[\da-fA-F]*:[\da-fA-F:]*)"  # IPv4 or IPv6, as a cluster IP is written
SERVICE_LINK = re.compile(
    rf"\w*SERVICE_HOST={ADDRESS}|\w*SERVICE_PORT(_\w+)?=\d+|\w*PORT(_\d+_(TCP|UDP|SCTP))?=(tcp|udp|sctp)://\S+"
    rf"|\w*PORT_\d+_(TCP|UDP|SCTP)_(ADDR={ADDRESS}|PORT=\d+|PROTO=(tcp|udp|sctp))"
)


class UnknownSettings(ValueError):
    """ENCODER_ variables that name no setting: one line each, naming the closest setting."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def setting_names() -> list[str]:
    """Every setting's variable name, as the environment spells it."""
    return [f"{PREFIX}{name.upper()}" for name in Settings.model_fields]


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``ENCODER_`` variable of ``environ`` that names no setting, with the closest that does:
    a misspelt setting would otherwise be ignored and its default served without a word."""
    known = setting_names()
    suffixes = {name[len(PREFIX) :]: name for name in known}
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in known or SERVICE_LINK.fullmatch(f"{upper}={environ[variable]}"):
            continue
        (closest,) = difflib.get_close_matches(upper[len(PREFIX) :], list(suffixes), n=1, cutoff=0.0)
        lines.append(f"{variable}: no such setting; did you mean {suffixes[closest]}?")
    return lines


@lru_cache
def get_settings() -> Settings:
    """The process's settings, from its environment; UnknownSettings where an ``ENCODER_`` variable names none.
    Tests build their own Settings and pass them to create_app."""
    unknown = unknown_settings(os.environ)
    if unknown:
        raise UnknownSettings(unknown)
    return Settings()
