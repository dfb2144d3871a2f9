"""The embedded default's image dataset: scikit-learn's bundled digits, as PNG files in class folders.

Why this one: it ships inside an installed package (no download at run time, works offline), it is a
real labelled image dataset (1,797 8x8 grey-scale images, 10 classes), and it is small enough for a
laptop. The files are byte-for-byte deterministic, so loading it twice uploads nothing the second time.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

#: Scaled from the 0..16 range of load_digits to 0..255 grey levels.
DIGITS_SCALE = 255 / 16


def _png(pixels) -> bytes:
    from PIL import Image

    image = Image.fromarray(pixels, mode="L")
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=9)  # no timestamps: same bytes every time
    return buf.getvalue()


def materialize_digits(dest: str | os.PathLike[str]) -> Path:
    """Write `<dest>/<label>/digit_<index>.png` for all 1,797 digits; returns `dest`.

    Idempotent: files whose bytes are already right are left untouched (their mtime too), so a warm
    cache costs one read per file. A partial directory (an earlier crash) is completed, not rebuilt.
    """
    import numpy as np
    from sklearn.datasets import load_digits

    root = Path(dest).expanduser()
    digits = load_digits()
    images = np.clip(np.rint(digits.images * DIGITS_SCALE), 0, 255).astype(np.uint8)
    for index, (pixels, label) in enumerate(zip(images, digits.target, strict=True)):
        path = root / str(int(label)) / f"digit_{index:04d}.png"
        data = _png(pixels)
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".png.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: a reader never sees half a PNG
    return root
