"""Models named by Hugging Face Hub id: ``org/name``, or ``org/name@revision`` (a branch, tag or commit).

    python -m app.download MODEL [MODEL ...]     fill the cache ahead of time (air-gapped hosts, images)

Only the files the service reads are fetched: the JSON files at the top and one folder down (config, tokenizer,
sentence-transformers' modules, Pooling and Dense configs), ``model.safetensors`` at the top and in the Dense
folders, and BGE-M3's two heads (``sparse_linear.pt``, ``colbert_linear.pt``, read with ``weights_only``). They
go to the standard Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub),
so a second start needs no network. ``HF_TOKEN`` is sent for gated and private models, ``HF_ENDPOINT`` names
another Hub, and with ``HF_HUB_OFFLINE=1`` only the cache is read.

A model counts as fetched once every file has arrived: the files are fetched one by one (each named in the log
with its size), and only then is a record of them written into the snapshot (``COMPLETE``). A download that
stalls (``HF_HUB_DOWNLOAD_TIMEOUT`` seconds without data, 10 by default) or breaks leaves no such record, so a
partial model is never served: the next start fetches what is missing, and an offline start says it is
incomplete. Every failure is one line naming the model (``DownloadError``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("app.download")

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
COMPLETE = ".encoder-service-complete.json"  # written into a snapshot once every file wanted has arrived
FETCHING = ".encoder-service-fetching"  # there while a fetch of ours is under way, or was cut short
MODULE_FOLDER = re.compile(r"^\d+_\w+$")  # sentence-transformers' module folders: 1_Pooling, 2_Dense, ...
CACHE_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}  # the cache, not the network
HEADS = ("sparse_linear.pt", "colbert_linear.pt")  # BGE-M3's token-weight and multi-vector layers
TRUE = ("1", "true", "yes", "on")


class DownloadError(ValueError):
    """A model that could not be had from the Hub or the cache: one line naming it and what to do."""


@dataclass(frozen=True)
class HubModel:
    repo: str  # org/name
    revision: str | None  # a branch, tag or commit; the default branch when None

    @classmethod
    def parse(cls, spec: str) -> HubModel | None:
        """The Hub id in ``spec``, or None where it is not one (a path, say)."""
        match = HUB_ID.match(spec)
        return cls(match["repo"], match["revision"]) if match else None

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def wanted(filename: str) -> bool:
    """Whether the service reads this file of a model repository: the JSON files at the top and in
    sentence-transformers' numbered module folders (1_Pooling, 2_Dense), their model.safetensors, BGE-M3's heads."""
    parts = filename.split("/")
    if len(parts) > 2 or (len(parts) == 2 and not MODULE_FOLDER.match(parts[0])):
        return False
    return parts[-1].endswith(".json") or parts[-1] == "model.safetensors" or filename in HEADS


def cache_dir() -> Path:
    """The Hugging Face cache, as huggingface_hub finds it (read now, not when it was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return base / "huggingface" / "hub"


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def repo_folder(model: HubModel) -> Path:
    return cache_dir() / f"models--{model.repo.replace('/', '--')}"


def ref_name(model: HubModel) -> str:
    """The cache's name for the revision: huggingface_hub files the default branch as "main"."""
    return model.revision or "main"


def cached(model: HubModel) -> Path | None:
    """The model's snapshot in the cache, where there is a whole one; None where there is none; DownloadError for
    one that is not whole: a download of ours that was interrupted, or a snapshot that lacks a file it names."""
    revision = ref_name(model)
    commit = revision
    if not COMMIT.match(revision):
        try:
            commit = (repo_folder(model) / "refs" / revision).read_text().strip()
        except OSError:  # never whole here; say so where a fetch of ours was cut short
            if any((repo_folder(model) / "snapshots").glob(f"*/{FETCHING}")):
                raise DownloadError(
                    f"the cached copy of {model} in {repo_folder(model)} is incomplete (a download was interrupted): "
                    f"fetch it again with network access (python -m app.download {model})"
                ) from None
            return None
    snapshot = repo_folder(model) / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    if (snapshot / COMPLETE).is_file():
        return snapshot
    if (snapshot / FETCHING).is_file():
        raise DownloadError(
            f"the cached copy of {model} in {snapshot} is incomplete (a download was interrupted): fetch it again "
            f"with network access (python -m app.download {model})"
        )
    missing = missing_files(snapshot)  # filled by another tool (huggingface-cli, sentence-transformers)
    if missing:
        raise DownloadError(f"the cached copy of {model} in {snapshot} lacks {', '.join(missing)}: fetch it again")
    return snapshot


def missing_files(snapshot: Path) -> list[str]:
    """What a snapshot filled by another tool lacks of what the service reads: the config, tokenizer and weights,
    and the config (and a Dense module's weights) of each module that modules.json names."""
    needed = ["config.json", "tokenizer.json", "model.safetensors"]
    try:
        modules = json.loads((snapshot / "modules.json").read_text())
    except (OSError, ValueError):
        modules = []
    for module in modules if isinstance(modules, list) else []:
        path, kind = str(module.get("path", "")), str(module.get("type", ""))
        if path and MODULE_FOLDER.match(path) and kind.endswith(("Pooling", "Dense")):
            needed.append(f"{path}/config.json")
            if kind.endswith("Dense"):
                needed.append(f"{path}/model.safetensors")
    return [name for name in needed if not (snapshot / name).is_file()]


def fetch(model: HubModel) -> Path:
    """The model's snapshot directory, fetched from the Hub where the cache lacks it (see the module's text)."""
    local = without_network(model)
    if local is not None:
        return local

    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub, token = endpoint(), os.environ.get("HF_TOKEN") or None
    quiet_hub_logs()
    try:
        return download(model, hub, token)
    except DownloadError:
        raise
    except GatedRepoError as error:
        raise DownloadError(
            f"{model} is gated: accept its conditions on its page at {hub}/{model.repo}, then set HF_TOKEN to a "
            f"token of that account ({first_line(error)})"
        ) from error
    except RevisionNotFoundError as error:
        raise DownloadError(f"{model.repo} has no revision {model.revision!r} at {hub}") from error
    except RepositoryNotFoundError as error:
        raise DownloadError(
            f"no model {model.repo} at {hub} (a private one needs HF_TOKEN set to a token that can read it)"
        ) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status is not None and (status >= 500 or status == 429):  # the Hub busy or down: the cache, if whole
            return unreachable(model, hub, error)
        raise DownloadError(f"the Hub at {hub} refused {model}: {first_line(error)}") from error
    except OSError as error:
        if error.errno in CACHE_ERRORS:
            raise DownloadError(
                f"cannot write {model} into the Hugging Face cache at {cache_dir()}: {error.strerror} (set HF_HOME "
                "to a writable directory with room, or mount one there)"
            ) from error
        return unreachable(model, hub, error)
    except Exception as error:  # the network: unreachable, stalled, broken off
        return unreachable(model, hub, error)


def without_network(model: HubModel) -> Path | None:
    """The cached snapshot where none of the Hub is asked: offline (DownloadError if the cache lacks it), or a
    commit pinned and whole in the cache; else None."""
    if offline():
        snapshot = cached(model)
        if snapshot is None:
            raise DownloadError(
                f"{model} is not in the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE=1: fetch it first "
                f"where the Hub can be reached (python -m app.download {model}), or unset HF_HUB_OFFLINE"
            )
        return snapshot
    if COMMIT.match(model.revision or ""):  # a commit never changes: a whole copy needs no network
        try:
            pinned = cached(model)
        except DownloadError:
            pinned = None
        if pinned is not None:
            logger.info("%s: in the cache (%s)", model, pinned)
            return pinned
    return None


def quiet_hub_logs() -> None:
    """No line per HTTP request (the files fetched are logged), and no progress bars in a log."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def download(model: HubModel, hub: str, token: str | None) -> Path:
    """The snapshot of the revision's commit, each file the cache lacks fetched from ``hub``; a snapshot is marked
    whole (COMPLETE) only once every file is in. The Hub's errors pass through (``fetch`` words them)."""
    from huggingface_hub import HfApi, hf_hub_download

    info = HfApi(endpoint=hub, token=token).model_info(model.repo, revision=model.revision, files_metadata=True)
    files = {sibling.rfilename: sibling.size or 0 for sibling in info.siblings or []}
    check_weights(model, files)
    chosen = sorted(name for name in files if wanted(name))
    commit = info.sha or ""
    if not COMMIT.match(commit):
        raise DownloadError(f"the Hub at {hub} gave no commit for {model}")
    snapshot = repo_folder(model) / "snapshots" / commit
    if (snapshot / COMPLETE).is_file():
        write_ref(model, commit)
        logger.info("%s: commit %s, already in the cache (%s)", model, commit[:12], snapshot)
        return snapshot
    logger.info(
        "fetching %s (commit %s) from %s: %d files, %.1f MB, into %s",
        model,
        commit[:12],
        hub,
        len(chosen),
        sum(files[name] for name in chosen) / 1e6,
        cache_dir(),
    )
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / FETCHING).write_text(str(model))  # until every file is in: an interrupted copy says so
    for number, name in enumerate(chosen, 1):
        logger.info("%s: %s (%.1f MB), file %d of %d", model, name, files[name] / 1e6, number, len(chosen))
        # every file at the one commit, whatever the branch does meanwhile
        hf_hub_download(model.repo, name, revision=commit, cache_dir=cache_dir(), endpoint=hub, token=token)
    write_ref(model, commit)
    (snapshot / COMPLETE).write_text(json.dumps({"model": str(model), "commit": commit, "files": chosen}))
    (snapshot / FETCHING).unlink(missing_ok=True)
    logger.info("fetched %s into %s", model, snapshot)
    return snapshot


def unreachable(model: HubModel, hub: str, error: Exception) -> Path:
    """The whole cached copy where the Hub cannot answer, else DownloadError."""
    try:
        found = cached(model)
    except DownloadError:
        found = None
    if found is not None:
        logger.warning("cannot reach %s (%s): serving %s as cached", hub, first_line(error), model)
        return found
    raise DownloadError(
        f"could not fetch {model} from {hub}: {type(error).__name__}: {first_line(error)} (nothing of it is "
        "served; a download that stalls for HF_HUB_DOWNLOAD_TIMEOUT seconds, 10 by default, is given up)"
    ) from error


def write_ref(model: HubModel, commit: str) -> None:
    """Point the cache's name for the revision (its branch or tag, "main" for the default) at ``commit``, as
    huggingface_hub does, so that an offline start finds the very commit fetched."""
    if COMMIT.match(ref_name(model)):
        return
    ref = repo_folder(model) / "refs" / ref_name(model)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)


def check_weights(model: HubModel, files: dict[str, int]) -> None:
    """DownloadError where the repository has no single model.safetensors, the only weights read here."""
    if "model.safetensors" in files:
        return
    if "model.safetensors.index.json" in files:
        raise DownloadError(
            f"{model} keeps its weights in several safetensors shards, which are not read here yet: one "
            "model.safetensors is"
        )
    pickles = sorted(name for name in files if name.endswith(".bin") and "/" not in name)
    if pickles:
        raise DownloadError(
            f"{model} has its weights only as {', '.join(pickles)} (a pickle, which can run code when read): "
            "convert them to model.safetensors (safetensors' convert script, or the Hub's conversion Space opens "
            "a pull request), then name that revision (org/name@refs/pr/N) or a directory holding it"
        )
    raise DownloadError(f"{model} has no model.safetensors")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def hub_model(spec: str | Path) -> HubModel | None:
    """The Hub id ``spec`` names, or None where it is a path: a Path (ENCODER_MODEL_DIR, the bundled model), a
    string that exists here, starts with . / or ~, or whose first part is a directory here (``models/x``)."""
    if isinstance(spec, Path) or spec.startswith((".", "/", "~")) or Path(spec).exists():
        return None
    if Path(spec.split("/", 1)[0]).is_dir():
        return None
    return HubModel.parse(spec)


def resolve(spec: str | Path) -> Path:
    """A model's directory: ``spec`` itself where it is a path, else the snapshot of the Hub id it names (fetched
    where needed). DownloadError where it is neither."""
    model = hub_model(spec)
    if model is not None:
        return fetch(model)
    path = Path(spec)
    if path.exists():
        return path
    hint = "" if isinstance(spec, Path) else " (nor is it a Hugging Face Hub id: org/name or org/name@revision)"
    if not isinstance(spec, Path) and HubModel.parse(spec) is not None:
        hint = f" (read as a directory, since {spec.split('/', 1)[0]} is one here; a Hub id would be fetched)"
    raise DownloadError(f"model directory {spec} does not exist{hint}")


def default_name(spec: str | Path) -> str:
    """The name a model is served under when none is given: a Hub id's repository (org/name), a directory's name."""
    model = hub_model(spec)
    return model.repo if model is not None else Path(spec).resolve().name


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Fetch models named by Hub id into the Hugging Face cache.")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="org/name or org/name@revision")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    failed = 0
    for spec in args.models:
        model = HubModel.parse(spec)
        try:
            if model is None:
                raise DownloadError(f"{spec}: not a Hugging Face Hub id (org/name or org/name@revision)")
            print(fetch(model))
        except DownloadError as error:
            print(f"error: {error}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
