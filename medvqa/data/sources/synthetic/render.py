"""Rendering a synthetic image (numpy + PIL only) from its `ImageSpec`.

Coordinates are normalised: the image spans [-0.5, 0.5]^2. The cues are strong and global
(modality contrast, body outline, bright/dark blobs on one side, small vs large) so that a
~1M-parameter VLM can learn them in minutes on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from medvqa.data.sources.synthetic.cases import (
    AGE_RANGE,
    LESION_COUNT_SCALE,
    LESION_RADIUS,
    LESION_SLOTS,
    ImageSpec,
)


class _Canvas:
    """A float image in [0, 1] with soft-edged drawing primitives on normalised coordinates."""

    def __init__(self, size: int, fill: float | np.ndarray = 0.0) -> None:
        self.size = size
        axis = (np.arange(size, dtype=np.float64) + 0.5) / size - 0.5
        self.y, self.x = np.meshgrid(axis, axis, indexing="ij")
        self.px = 1.0 / size  # one pixel in normalised units
        self.img = np.broadcast_to(np.asarray(fill, dtype=np.float64), (size, size)).copy()

    def ellipse(self, cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
        """Soft mask of an ellipse (about one pixel of anti-aliasing)."""
        ax, ay = max(ax, self.px), max(ay, self.px)
        r = np.sqrt(((self.x - cx) / ax) ** 2 + ((self.y - cy) / ay) ** 2)
        edge = self.px / min(ax, ay)
        return np.clip((1.0 - r) / edge + 0.5, 0.0, 1.0)

    def ring(self, cx: float, cy: float, ax: float, ay: float, thickness: float) -> np.ndarray:
        """Soft mask of an elliptic ring whose outer edge is the ellipse (ax, ay)."""
        t = max(thickness, 1.2 * self.px)
        return np.clip(self.ellipse(cx, cy, ax, ay) - self.ellipse(cx, cy, ax - t, ay - t), 0, 1)

    def paint(self, mask: np.ndarray, value: float | np.ndarray) -> None:
        self.img = self.img * (1.0 - mask) + mask * value


@dataclass(frozen=True)
class _Geometry:
    """Where the body sits and where lesions go (the lesion frame), in normalised units."""

    cx: float
    cy: float  # body centre
    ax: float
    ay: float
    fy_centre: float  # lesion frame centre (x is cx)
    fx: float  # lesion frame half-width
    fy: float  # lesion frame half-height
    bone: float  # bone brightness (dimmer with age)


# Body half-axes per body part for cross-sections (ct, mri) and projections (x-ray).
_SECTION_AXES = {"head": (0.36, 0.36), "chest": (0.44, 0.30), "abdomen": (0.42, 0.32)}
_XRAY_AXES = {"head": (0.34, 0.41), "chest": (0.47, 0.62), "abdomen": (0.46, 0.65)}
_XRAY_LESION_FRAME = {"head": (0.28, 0.3), "chest": (0.4, 0.3), "abdomen": (0.38, 0.34)}


def _geometry(spec: ImageSpec, rng: np.random.Generator) -> _Geometry:
    """Body outline with a little jitter; women get a slightly narrower body, age dims bone."""
    table = _XRAY_AXES if spec.modality == "x-ray" else _SECTION_AXES
    ax, ay = table[spec.body_part]
    scale = rng.uniform(0.95, 1.04)
    ax, ay = ax * scale, ay * scale * rng.uniform(0.97, 1.03)
    if spec.sex == "F":
        ax *= 0.92
    cx, cy = rng.uniform(-0.02, 0.02, size=2)
    if spec.modality == "x-ray":
        cy += 0.08 if spec.body_part != "head" else 0.03
        fx, fy = _XRAY_LESION_FRAME[spec.body_part]
        fx *= 0.92 if spec.sex == "F" else 1.0
        frame_cy = cy - (0.1 if spec.body_part != "head" else 0.0)
    else:
        fx, fy, frame_cy = 0.85 * ax, 0.85 * ay, cy  # keep lesions off the rim
    age_frac = (spec.age - AGE_RANGE[0]) / (AGE_RANGE[1] - AGE_RANGE[0])
    bone = 1.0 - 0.3 * age_frac
    return _Geometry(float(cx), float(cy), ax, ay, float(frame_cy), fx, fy, bone)


def _draw_ct(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """CT: black air, mid-grey soft tissue, bright bone, air-dark lungs."""
    cx, cy, ax, ay, b = g.cx, g.cy, g.ax, g.ay, g.bone
    c.paint(c.ellipse(cx, cy, ax, ay), 0.45 + rng.uniform(-0.03, 0.03))
    if part == "head":
        c.paint(c.ring(cx, cy, ax, ay, 0.07), 0.95 * b)
        c.paint(c.ellipse(cx, cy, ax - 0.07, ay - 0.07), 0.42)
        for s in (-1, 1):  # lateral ventricles
            c.paint(c.ellipse(cx + s * 0.05, cy - 0.02, 0.03, 0.09), 0.18)
    elif part == "chest":
        c.paint(c.ring(cx, cy, ax, ay, 0.035), 0.75 * b)
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.48 * ax, cy - 0.05 * ay, 0.36 * ax, 0.68 * ay), 0.07)
        c.paint(c.ellipse(cx + 0.12 * ax, cy + 0.2 * ay, 0.2 * ax, 0.3 * ay), 0.55)
        c.paint(c.ellipse(cx, cy + 0.75 * ay, 0.07 * ax, 0.07 * ax), 0.95 * b)
    else:
        c.paint(c.ring(cx, cy, ax, ay, 0.03), 0.65 * b)
        c.paint(c.ellipse(cx - 0.45 * ax, cy - 0.15 * ay, 0.38 * ax, 0.5 * ay), 0.6)  # liver
        c.paint(c.ellipse(cx + 0.55 * ax, cy - 0.25 * ay, 0.17 * ax, 0.25 * ay), 0.57)
        for s in (-1, 1):  # kidneys
            c.paint(c.ellipse(cx + s * 0.42 * ax, cy + 0.45 * ay, 0.13 * ax, 0.2 * ay), 0.63)
        for _ in range(3):  # bowel loops
            bx, by = rng.uniform(-0.2, 0.25) * ax, rng.uniform(-0.3, 0.3) * ay
            c.paint(c.ellipse(cx + bx, cy + by, 0.1 * ax, 0.12 * ay), 0.33)
        c.paint(c.ellipse(cx, cy + 0.72 * ay, 0.08 * ax, 0.08 * ax), 0.95 * b)


def _draw_mri(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """MRI (T1-like): bright fat rim and soft tissue, dark bone, dark lungs."""
    cx, cy, ax, ay = g.cx, g.cy, g.ax, g.ay
    c.paint(c.ellipse(cx, cy, ax, ay), 0.55 + rng.uniform(-0.03, 0.03))
    c.paint(c.ring(cx, cy, ax, ay, 0.06), 0.9)  # subcutaneous fat
    if part == "head":
        c.paint(c.ring(cx, cy, ax - 0.05, ay - 0.05, 0.05), 0.1)  # skull: dark on MRI
        c.paint(c.ellipse(cx, cy, ax - 0.1, ay - 0.1), 0.5)
        c.paint(c.ellipse(cx, cy, ax - 0.16, ay - 0.16), 0.62)  # white matter
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.05, cy - 0.02, 0.03, 0.09), 0.12)
    elif part == "chest":
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.48 * ax, cy - 0.05 * ay, 0.36 * ax, 0.66 * ay), 0.05)
        c.paint(c.ellipse(cx + 0.12 * ax, cy + 0.2 * ay, 0.2 * ax, 0.3 * ay), 0.7)
        c.paint(c.ellipse(cx, cy + 0.74 * ay, 0.08 * ax, 0.08 * ax), 0.25)
    else:
        c.paint(c.ellipse(cx - 0.45 * ax, cy - 0.15 * ay, 0.38 * ax, 0.5 * ay), 0.48)
        c.paint(c.ellipse(cx + 0.55 * ax, cy - 0.25 * ay, 0.17 * ax, 0.25 * ay), 0.44)
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.42 * ax, cy + 0.45 * ay, 0.13 * ax, 0.2 * ay), 0.8)
        for _ in range(3):
            bx, by = rng.uniform(-0.2, 0.25) * ax, rng.uniform(-0.3, 0.3) * ay
            c.paint(c.ellipse(cx + bx, cy + by, 0.1 * ax, 0.12 * ay), 0.65)
        c.paint(c.ellipse(cx, cy + 0.72 * ay, 0.08 * ax, 0.08 * ax), 0.25)


def _draw_xray(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """X-ray projection: dense = bright (bones white, lungs dark), no black cross-section."""
    cx, cy, ax, ay, b = g.cx, g.cy, g.ax, g.ay, g.bone
    body = c.ellipse(cx, cy, ax, ay)
    if part == "head":
        c.paint(body, 0.45)
        c.paint(c.ring(cx, cy, ax, ay, 0.07), 0.92 * b)  # skull vault
        for s in (-1, 1):  # orbits
            c.paint(c.ellipse(cx + s * 0.12, cy + 0.12, 0.07, 0.06), 0.28)
        jaw = c.ring(cx, cy + 0.16, 0.24, 0.24, 0.04) * (c.y > cy + 0.24)
        c.paint(jaw, 0.85 * b)
    elif part == "chest":
        c.paint(body, 0.55)
        lungs = np.zeros_like(c.img)
        for s in (-1, 1):
            lungs = np.maximum(lungs, c.ellipse(cx + s * 0.2, g.fy_centre, 0.15, 0.3))
        c.paint(lungs, 0.17)
        dx = c.x - cx
        phase = (c.y - 0.9 * dx**2 - rng.uniform(0, 0.09)) / 0.09
        ribs = (np.sin(2 * np.pi * phase) > 0.7) * body * (np.abs(dx) > 0.05) * (c.y < cy + 0.25)
        c.paint(ribs.astype(np.float64), 0.35 + 0.35 * b)
        c.paint(c.ellipse(cx + 0.06, g.fy_centre + 0.17, 0.13, 0.12), 0.62)  # heart shadow
        spine = np.clip((0.035 - np.abs(dx)) / c.px + 0.5, 0, 1) * body
        c.paint(spine, 0.9 * b)
    else:
        c.paint(body, 0.45)
        dx = c.x - cx
        for _ in range(4):  # bowel gas
            gx, gy = rng.uniform(-0.28, 0.28), rng.uniform(-0.25, 0.2)
            c.paint(c.ellipse(cx + gx, cy + gy, 0.035, 0.03), 0.3)
        column = np.clip((0.05 - np.abs(dx)) / c.px + 0.5, 0, 1) * (c.y < cy + 0.3)
        gaps = (np.sin(2 * np.pi * (c.y - cy) / 0.1) > -0.75).astype(np.float64)
        c.paint(column * gaps, 0.88 * b)
        pelvis = c.ring(cx, cy + 0.45, 0.36, 0.24, 0.045) * (c.y > cy + 0.25)
        c.paint(pelvis, 0.88 * b)


_DRAW: dict[str, Callable[[_Canvas, str, _Geometry, np.random.Generator], None]] = {
    "ct": _draw_ct,
    "mri": _draw_mri,
    "x-ray": _draw_xray,
}
_BACKGROUND = {"ct": 0.0, "mri": 0.03}
_NOISE = {"ct": 0.035, "mri": 0.03, "x-ray": 0.03}
_BLUR = {"mri": 0.75, "x-ray": 0.6}  # Gaussian blur radius at 64 px (CT is not blurred)


def lesion_centres(
    spec: ImageSpec, g: _Geometry, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """Centres of the lesions, all on the chosen side so that 'where' has one answer."""
    side = -1.0 if spec.lesion_side == "left" else 1.0
    centres = []
    for u, v in LESION_SLOTS[spec.lesion_count]:
        du, dv = rng.uniform(-0.06, 0.06, size=2)
        centres.append((g.cx + side * (u + du) * g.fx, g.fy_centre + (v + dv) * g.fy))
    return centres


def lesion_radius(spec: ImageSpec) -> float:
    """Normalised radius: large is ~2.1x small, easy to tell apart at 64 px."""
    return LESION_RADIUS[spec.lesion_size] * LESION_COUNT_SCALE[spec.lesion_count]


@dataclass(frozen=True)
class _Lesion:
    """One finding as drawn: its centre, radii and kind (a cyst's wall lies outside `rx`)."""

    x: float
    y: float
    rx: float
    ry: float
    kind: str

    def extent(self, c: _Canvas) -> np.ndarray:
        """The soft mask of every pixel the finding is painted on (a cyst with its wall)."""
        if self.kind == "mass":
            return c.ellipse(self.x, self.y, self.rx, self.ry)
        wall = max(0.2 * self.rx, 1.0 * c.px)  # outside r, so small cysts keep a dark core
        return c.ellipse(self.x, self.y, self.rx + wall, self.rx + wall)


def _lesions(spec: ImageSpec, g: _Geometry, rng: np.random.Generator) -> list[_Lesion]:
    """The findings of `spec`, drawn from `rng` (centres first, then each one's size)."""
    r0 = lesion_radius(spec)
    out = []
    for x, y in lesion_centres(spec, g, rng):
        r = r0 * rng.uniform(0.92, 1.08)
        ry = r * rng.uniform(0.85, 1.0) if spec.lesion_kind == "mass" else r
        out.append(_Lesion(x, y, r, ry, spec.lesion_kind))
    return out


def _draw_lesions(c: _Canvas, lesions: Sequence[_Lesion]) -> None:
    """Mass = bright blob; cyst = dark blob with a bright wall (visible even inside a lung)."""
    for lesion in lesions:
        if lesion.kind == "mass":
            c.paint(lesion.extent(c), 0.97)
        else:
            c.paint(lesion.extent(c), 0.85)
            c.paint(c.ellipse(lesion.x, lesion.y, lesion.rx, lesion.rx), 0.03)


def _findings_mask(c: _Canvas, lesions: Sequence[_Lesion], blur: float) -> np.ndarray:
    """Label image (uint8): k on the pixels the k-th finding is painted on (its anti-aliased
    edge included) and on those the image's blur (`blur`: its radius in pixels) spreads it to,
    two radii and a pixel around; 0 elsewhere."""
    labels = np.zeros((c.size, c.size), dtype=np.uint8)
    for k, lesion in enumerate(lesions, 1):
        labels[(lesion.extent(c) > 0) & (labels == 0)] = k
    reach = 1 + int(np.ceil(2 * blur))
    grown = np.asarray(Image.fromarray(labels).filter(ImageFilter.MaxFilter(2 * reach + 1)))
    return np.where(labels > 0, labels, grown)


def render_image(spec: ImageSpec, size: int, seed: Sequence[int]) -> np.ndarray:
    """Render a grayscale image in [0, 1] (float, size x size) for one image spec.

    Anatomy, lesions and noise use separate random streams derived from `seed`, so the same
    seed with and without a lesion gives images that differ only around the lesion.
    """
    return render_with_findings(spec, size, seed)[0]


def render_with_findings(
    spec: ImageSpec, size: int, seed: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """`render_image`'s image and the exact mask of its findings (`_findings_mask`: all 0
    without a lesion), drawn from the same shapes."""
    anatomy_rng = np.random.default_rng([*seed, 0])
    lesion_rng = np.random.default_rng([*seed, 1])
    noise_rng = np.random.default_rng([*seed, 2])
    geometry = _geometry(spec, anatomy_rng)
    if spec.modality == "x-ray":
        axis = (np.arange(size) + 0.5) / size
        background = np.repeat((0.3 - 0.22 * axis)[:, None], size, axis=1)
        canvas = _Canvas(size, background)
    else:
        canvas = _Canvas(size, _BACKGROUND[spec.modality])
    _DRAW[spec.modality](canvas, spec.body_part, geometry, anatomy_rng)
    lesions = _lesions(spec, geometry, lesion_rng) if spec.lesion else []
    _draw_lesions(canvas, lesions)
    img = canvas.img * anatomy_rng.uniform(0.95, 1.05)
    img = img + noise_rng.normal(0.0, _NOISE[spec.modality], img.shape)
    blur = _BLUR.get(spec.modality, 0.0) * size / 64
    if spec.modality == "mri":
        img = _blur(np.clip(img, 0, 1), blur)
        theta = anatomy_rng.uniform(0, 2 * np.pi)  # receive-coil shading
        img = img * (1.0 + 0.6 * (canvas.x * np.cos(theta) + canvas.y * np.sin(theta)))
    elif spec.modality == "x-ray":
        img = _blur(np.clip(img, 0, 1), blur)
    return np.clip(img, 0.0, 1.0), _findings_mask(canvas, lesions, blur)


def _blur(img: np.ndarray, radius: float) -> np.ndarray:
    """Gaussian blur through PIL (no scipy/torchvision needed); 8-bit is what gets stored anyway."""
    pil = Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8))
    out = pil.filter(ImageFilter.GaussianBlur(radius))
    return np.asarray(out, dtype=np.float64) / 255.0


def to_png_image(img: np.ndarray) -> Image.Image:
    """Grayscale float image -> 8-bit RGB, the format every VLM processor expects."""
    gray = Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8))
    return gray.convert("RGB")
