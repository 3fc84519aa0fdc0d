"""Episodes as video files: H.264 mp4 through imageio-ffmpeg, else an animated GIF (Pillow).

imageio-ffmpeg is a dependency because its wheel carries a static ffmpeg with libx264 for every
platform pip serves, so an mp4 a browser plays (H.264, yuv420p) needs no system package; OpenCV's
wheel encodes only MPEG-4 part 2, which browsers do not play, and PyAV is a far larger build.
GIF stays as the fallback for an environment without that wheel.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def headless_rendering() -> None:
    """Before an env is made to render: pygame (the classic-control and PettingZoo classic
    renderers) opens a display and an audio device on init; a pod or CI machine has neither,
    and SDL's and ALSA's complaints would fill the output."""
    import os

    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def _even(frame: np.ndarray) -> np.ndarray:
    """Pad to even height and width (yuv420p halves both)."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def _rgb(frame: np.ndarray) -> np.ndarray:
    frame = np.asarray(frame)
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    return np.ascontiguousarray(frame[:, :, :3], dtype=np.uint8)


def write_video(frames: Sequence[np.ndarray], path: Path, fps: float = 30.0) -> Path:
    """Write RGB frames [H, W, 3] to `path` (its suffix is replaced: .mp4, or .gif without an
    encoder) and return the file written."""
    if not frames:
        raise ValueError("no frames to write")
    rgb = [_even(_rgb(f)) for f in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import imageio_ffmpeg
    except ImportError:
        return _write_gif(rgb, path.with_suffix(".gif"), fps)
    out = path.with_suffix(".mp4")
    h, w = rgb[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(
        str(out), (w, h), fps=fps, codec="libx264", macro_block_size=1, ffmpeg_log_level="error",
        output_params=["-movflags", "+faststart"],  # playable while it streams
    )  # fmt: skip
    writer.send(None)  # the generator starts ffmpeg on its first send
    for frame in rgb:
        writer.send(frame)
    writer.close()
    return out


def encode_video(frames: Sequence[np.ndarray], fps: float) -> tuple[str, bytes]:
    """The frames as a video file's (suffix, bytes): what an evaluation actor sends the driver
    (its process has no say in where the run directory is)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="impala-video-") as tmp:
        written = write_video(frames, Path(tmp) / "episode", fps)
        return written.suffix, written.read_bytes()


def _write_gif(frames: list[np.ndarray], path: Path, fps: float) -> Path:
    from PIL import Image

    path.write_bytes(_gif([Image.fromarray(f) for f in frames], max(1, round(1000 / fps))))
    return path


def _gif(images: list[Any], duration_ms: int) -> bytes:
    """Pillow images as one looping animated GIF."""
    import io

    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:],
                   duration=duration_ms, loop=0)  # fmt: skip
    return out.getvalue()


def preview_gif(
    frames: Sequence[np.ndarray], max_width: int = 240, max_frames: int = 150, fps: float = 30.0
) -> tuple[bytes, int, int]:
    """A small animated GIF of the frames (at most `max_width` wide and `max_frames` long,
    every k-th frame kept) for TensorBoard's images dashboard: (bytes, height, width)."""
    from PIL import Image

    step = max(1, -(-len(frames) // max_frames))
    images = [Image.fromarray(_rgb(f)) for f in frames[::step]]
    w, h = images[0].size
    if w > max_width:
        h, w = max(1, round(h * max_width / w)), max_width
        images = [im.resize((w, h)) for im in images]
    return _gif(images, max(20, round(1000 * step / fps))), h, w
