"""The attention viewer: a static page at / that draws what the public API returns."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def viewer() -> FileResponse:
    """The attention viewer page."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
