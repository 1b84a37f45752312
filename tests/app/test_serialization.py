"""The .npz answer written in parts: what numpy.load reads back, with no copy of the arrays' data made."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import pytest

from app.serialization import SENT_PART_BYTES, npz_parts, parts_length, sent_in_parts

ARRAYS: dict[str, Any] = {
    "attention": np.random.default_rng(0).random((2, 3, 5, 5), dtype=np.float32),
    "tokens": np.array(["[CLS]", "héllo", "[SEP]"], dtype=np.str_),
    "layers": np.array([0, 5], dtype=np.int64),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "scalar": np.array(3.5),
    "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C-contiguous: written in C order
}


def archive_bytes(parts: list) -> bytes:
    return b"".join(sent_in_parts(parts))


def test_numpy_reads_back_every_array_as_numpy_savez_wrote_it() -> None:
    data = archive_bytes(npz_parts(ARRAYS))
    assert zipfile.ZipFile(io.BytesIO(data)).testzip() is None  # every member's CRC checks
    reference = io.BytesIO()
    np.savez(reference, **ARRAYS)
    with np.load(io.BytesIO(data)) as ours, np.load(io.BytesIO(reference.getvalue())) as theirs:
        assert ours.files == theirs.files == list(ARRAYS)
        for name in ARRAYS:
            assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
            np.testing.assert_array_equal(ours[name], theirs[name])


def test_the_data_parts_are_the_arrays_own_memory() -> None:
    weights = np.ones((64, 64), dtype=np.float32)
    parts = npz_parts({"weights": weights})
    views = [part for part in parts if isinstance(part, memoryview)]
    assert len(views) == 1 and views[0].nbytes == weights.nbytes
    assert np.shares_memory(np.frombuffer(views[0], dtype=np.uint8), weights)
    assert parts_length(parts) == len(archive_bytes(parts))


def test_large_parts_are_sent_a_mebibyte_at_a_time() -> None:
    weights = np.arange(SENT_PART_BYTES // 2, dtype=np.float32)  # 2 MiB of data
    sent = list(sent_in_parts(npz_parts({"weights": weights})))
    assert max(len(part) for part in sent) == SENT_PART_BYTES
    with np.load(io.BytesIO(b"".join(sent))) as archive:
        np.testing.assert_array_equal(archive["weights"], weights)


def test_an_array_of_objects_is_refused() -> None:
    with pytest.raises(TypeError, match="pickle"):
        npz_parts({"objects": np.array([{"a": 1}], dtype=object)})
