"""Pictures of the two clusters for ``render_mode="rgb_array"``, drawn straight into numpy arrays.

Each viewer owns a preallocated ``(height, width, 3)`` uint8 frame and a copy of its static part
(titles, legend, axes), drawn once. A frame is that background copied back, then a few dozen
rectangles set by slicing and a few labels in a 3x5 bitmap font of our own: well under a
millisecond for the default clusters (``benchmarks/bench_render.py`` prints the figure), where
drawing the same information with matplotlib takes about a quarter of a second. ``frame()`` returns
a fresh array each call (video recorders keep the frames they are given).

* :class:`RoutingViewer`: per prefill instance, the queued work and this request's prefill on it
  stacked as Algorithm 1's TTFT estimate (the SLO at the top of the scale), the request's local
  prefix hit and the cache occupancy; the instance that took the last request highlighted.
* :class:`AdmissionViewer`: the prefill pool's queues (the request's prefill stacked on the
  instance it would go to), the decode pool's KV occupancy per instance with the time between
  tokens, the last decision (admit / reject) and the running counts.

The viewers know nothing of the environments: the environments' ``render`` methods pass them plain
numbers.
"""

from __future__ import annotations

import numpy as np

# -- colours (RGB) ------------------------------------------------------------------------------------
WHITE = (255, 255, 255)
INK = (30, 30, 30)
GRID = (200, 200, 200)
NOTE = (120, 120, 120)  # scale captions
PANEL = (244, 244, 244)
QUEUE = (31, 91, 168)  # queued work
PREFILL = (140, 184, 232)  # this request's prefill on top of the queue
OVER = (214, 39, 40)  # beyond the SLO / rejected
HIT = (255, 140, 0)  # the request's prefix hit
CACHE = (44, 160, 44)  # cache or decode occupancy
CHOSEN = (255, 236, 140)  # highlight of the chosen instance
PULL = (148, 103, 189)  # a pull of the best prefix
ADMIT = (44, 160, 44)

# -- a 3x5 bitmap font: upper-case letters, digits and a little punctuation ---------------------------
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111",
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111",
    ".": "000000000000010", ";": "000010000010100", ",": "000000000010100", ":": "000010000010000", "-": "000000111000000",
    "+": "000010111010000", "/": "001001010100100", "%": "101001010100101", "=": "000111000111000",
    "(": "010100100100010", ")": "010001001001010", ">": "100010001010100", "<": "001010100010001",
    "#": "101111101111101", " ": "000000000000000",
}
GLYPH_W, GLYPH_H = 3, 5


def _glyph_masks(scale: int) -> dict[str, np.ndarray]:
    block = np.ones((scale, scale), bool)
    return {c: np.kron(np.array([b == "1" for b in bits]).reshape(GLYPH_H, GLYPH_W), block)
            for c, bits in _GLYPHS.items()}


_MASKS: dict[int, dict[str, np.ndarray]] = {}


def text_width(text: str, scale: int = 2) -> int:
    """Width in pixels of ``text`` drawn by :meth:`Canvas.text` (one blank column between glyphs)."""
    return len(text) * (GLYPH_W + 1) * scale


class Canvas:
    """A preallocated RGB frame with rectangle and text primitives, and a static background.

    Draw the static part, call :meth:`freeze`, then per frame :meth:`clear` (back to the frozen
    background) and draw the rest."""

    def __init__(self, height: int, width: int):
        self.height, self.width = height, width
        self.pixels = np.empty((height, width, 3), np.uint8)
        self.pixels[:] = WHITE
        self._background = self.pixels.copy()

    def freeze(self) -> None:
        self._background = self.pixels.copy()

    def clear(self) -> None:
        np.copyto(self.pixels, self._background)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color) -> None:
        """Fill the pixels with ``x0 <= x < x1`` and ``y0 <= y < y1`` (clipped to the frame)."""
        x0, x1 = max(0, int(round(x0))), min(self.width, int(round(x1)))
        y0, y1 = max(0, int(round(y0))), min(self.height, int(round(y1)))
        if x1 > x0 and y1 > y0:
            self.pixels[y0:y1, x0:x1] = color

    def frame_rect(self, x0: float, y0: float, x1: float, y1: float, color, thickness: int = 1) -> None:
        """The outline of a rectangle."""
        t = thickness
        self.rect(x0, y0, x1, y0 + t, color)
        self.rect(x0, y1 - t, x1, y1, color)
        self.rect(x0, y0, x0 + t, y1, color)
        self.rect(x1 - t, y0, x1, y1, color)

    def text(self, x: float, y: float, text: str, color=INK, scale: int = 2) -> int:
        """Draw ``text`` (upper-cased; characters without a glyph are drawn as '#') with its top-left
        corner at ``(x, y)``; glyphs that would leave the frame are cut. Returns the x after it."""
        masks = _MASKS.get(scale)
        if masks is None:
            masks = _MASKS[scale] = _glyph_masks(scale)
        x, y = int(x), int(y)
        step = (GLYPH_W + 1) * scale
        gw, gh = GLYPH_W * scale, GLYPH_H * scale
        if y < 0 or y + gh > self.height:
            return x + step * len(text)
        for ch in text.upper():
            if ch != " " and 0 <= x and x + gw <= self.width:
                self.pixels[y:y + gh, x:x + gw][masks.get(ch, masks["#"])] = color
            x += step
        return x

    def gauge(self, x0: float, y0: float, x1: float, y1: float, fraction: float, color, ground=GRID) -> None:
        """A horizontal gauge: ``fraction`` (clipped to [0, 1]) of the box filled from the left."""
        f = 0.0 if not fraction > 0.0 else min(1.0, fraction)  # NaN reads empty
        self.rect(x0, y0, x1, y1, ground)
        self.rect(x0, y0, x0 + f * (x1 - x0), y1, color)

    def snapshot(self) -> np.ndarray:
        return self.pixels.copy()


def _columns(x0: int, x1: int, n: int) -> list[tuple[int, int]]:
    """``n`` equal columns between ``x0`` and ``x1``, each with a gap of a sixth of its width."""
    width = (x1 - x0) / n
    gap = max(1, int(width / 6)) if width >= 3 else 0
    return [(int(x0 + i * width) + gap, int(x0 + (i + 1) * width) - gap) for i in range(n)]


def _frame_width(n_columns: int, minimum: int, per_column: int = 6) -> int:
    """A frame width that leaves at least ``per_column`` pixels per column, a multiple of 16 (video
    encoders work in 16-pixel blocks)."""
    width = max(minimum, n_columns * per_column + 40)
    return -(-width // 16) * 16


def _column_labels(canvas: Canvas, columns, y: int) -> None:
    """The instance numbers under the columns (every k-th where the columns are narrow)."""
    every = max(1, -(-(text_width("00") + 4) // max(1, columns[0][1] - columns[0][0] + 4)))
    for i, (x0, x1) in enumerate(columns):
        if i % every == 0:
            canvas.text((x0 + x1) / 2 - text_width(str(i)) / 2, y, str(i), INK)


def _legend(canvas: Canvas, x: int, y: int, items) -> None:
    for label, color in items:
        canvas.rect(x, y, x + 10, y + 10, color)
        x = canvas.text(x + 14, y, label) + 12


def _stacked_bar(canvas: Canvas, x0: int, x1: int, top: int, bottom: int, first: float, second: float,
                 scale: float, first_color, second_color) -> None:
    """A vertical bar of ``first`` then ``second`` (in units where ``scale`` fills the height);
    what goes past the top is drawn as a red cap."""
    h = bottom - top
    a = min(1.0, first / scale) if first > 0 else 0.0
    b = min(1.0, (first + second) / scale) if first + second > 0 else 0.0
    canvas.rect(x0, bottom - b * h, x1, bottom - a * h, second_color)
    canvas.rect(x0, bottom - a * h, x1, bottom, first_color)
    if first + second > scale:
        canvas.rect(x0, top, x1, top + 4, OVER)


def _header(canvas: Canvas, now_s: float, request: int, requests: int, request_text: str) -> None:
    """Start a frame: the background, the clock, the request count and the episode's progress."""
    canvas.clear()
    clock = f"T = {now_s:.1f} S"
    canvas.text(canvas.width - 10 - text_width(clock), 8, clock)
    canvas.text(10, 36, f"REQUEST {request}/{requests}{request_text}")
    canvas.gauge(10, 54, canvas.width - 10, 58, request / requests if requests else 0.0, INK)


class RoutingViewer:
    """The prefill cluster of ``PrefillRouting-v0`` as a picture."""

    MIN_WIDTH, HEIGHT = 640, 400
    BAR_TOP, BAR_BOTTOM = 80, 270
    HIT_Y, CACHE_Y = 292, 318

    def __init__(self, n_instances: int, ttft_slo_s: float):
        self.n, self.slo = int(n_instances), float(ttft_slo_s)
        width = _frame_width(self.n, self.MIN_WIDTH)
        c = self.canvas = Canvas(self.HEIGHT, width)
        self.columns = _columns(20, width - 20, self.n)
        c.text(10, 8, "PREFILL ROUTING", INK, scale=3)
        c.rect(20, self.BAR_TOP - 1, width - 20, self.BAR_TOP, GRID)  # the SLO line
        c.text(20, self.BAR_TOP - 14, f"QUEUE + PREFILL = ESTIMATED TTFT; TOP = TTFT SLO {self.slo:g} S", NOTE)
        c.rect(20, self.BAR_BOTTOM, width - 20, self.BAR_BOTTOM + 1, INK)
        c.text(20, self.HIT_Y - 12, "PREFIX HIT OF THIS REQUEST", INK)
        c.text(20, self.CACHE_Y - 12, "CACHE OCCUPANCY", INK)
        _column_labels(c, self.columns, self.CACHE_Y + 16)
        _legend(c, 10, self.HEIGHT - 22, [("QUEUE", QUEUE), ("PREFILL", PREFILL), ("HIT", HIT), ("CACHE", CACHE),
                                          ("LAST CHOICE", CHOSEN), ("PULL", PULL), ("PAST SLO", OVER)])
        c.freeze()

    def frame(self, now_s: float, request: int, requests: int, input_tokens: int, queue_s, prefill_s,
              hit_fraction, cache_fraction, chosen: int | None = None, pulled: bool = False,
              last_ttft_s: float | None = None) -> np.ndarray:
        """The picture: ``queue_s``, ``prefill_s`` (this request's prefill time on each instance),
        ``hit_fraction`` and ``cache_fraction`` per instance; ``chosen`` the instance that took the
        last request (and ``pulled`` whether it pulled first, ``last_ttft_s`` its TTFT)."""
        c = self.canvas
        _header(c, now_s, request, requests, f"  INPUT {input_tokens} TOK")
        width = c.width
        if chosen is not None:
            x0, x1 = self.columns[chosen]
            pad = max(1, (x1 - x0) // 8)
            c.rect(x0 - pad, self.BAR_TOP, x1 + pad, self.CACHE_Y + 12, CHOSEN)
            if pulled:
                c.rect(x0 - pad, self.BAR_TOP, x1 + pad, self.BAR_TOP + 6, PULL)
            if last_ttft_s is not None:
                label = f"LAST: {chosen}{' PULL' if pulled else ''} TTFT {last_ttft_s:.2f} S"
                c.text(width - 10 - text_width(label), 36, label)
        for i, (x0, x1) in enumerate(self.columns):
            _stacked_bar(c, x0, x1, self.BAR_TOP, self.BAR_BOTTOM, queue_s[i], prefill_s[i], self.slo, QUEUE,
                         PREFILL)
            c.gauge(x0, self.HIT_Y, x1, self.HIT_Y + 10, hit_fraction[i], HIT)
            c.gauge(x0, self.CACHE_Y, x1, self.CACHE_Y + 10, cache_fraction[i], CACHE)
        return c.snapshot()


class AdmissionViewer:
    """The prefill and decode pools of ``OverloadAdmission-v0`` as a picture."""

    MIN_WIDTH, HEIGHT = 640, 400
    BAR_TOP, BAR_BOTTOM = 110, 300

    def __init__(self, n_prefill: int, n_decode: int, ttft_slo_s: float, tbt_s: float):
        self.slo = float(ttft_slo_s)
        width = _frame_width(n_prefill + n_decode + 2, self.MIN_WIDTH)
        c = self.canvas = Canvas(self.HEIGHT, width)
        middle = width // 2
        self.prefill_columns = _columns(20, middle - 10, n_prefill)
        self.decode_columns = _columns(middle + 10, width - 20, n_decode)
        c.text(10, 8, "OVERLOAD ADMISSION", INK, scale=3)
        c.text(20, self.BAR_TOP - 26, "PREFILL QUEUES", INK)
        c.text(20, self.BAR_TOP - 14, f"TOP = TTFT SLO {self.slo:g} S", NOTE)
        c.text(middle + 10, self.BAR_TOP - 26, f"DECODE KV OCCUPANCY, TBT {tbt_s * 1000:g} MS", INK)
        c.text(middle + 10, self.BAR_TOP - 14, "TOP = FULL", NOTE)
        for x_from, x_to in ((20, middle - 10), (middle + 10, width - 20)):
            c.rect(x_from, self.BAR_TOP - 1, x_to, self.BAR_TOP, GRID)
            c.rect(x_from, self.BAR_BOTTOM, x_to, self.BAR_BOTTOM + 1, INK)
        for columns in (self.prefill_columns, self.decode_columns):
            _column_labels(c, columns, self.BAR_BOTTOM + 6)
        c.text(20, 330, "DECODE POOL", INK)
        c.text(20, 346, "PREDICTED TTFT / SLO", INK)
        _legend(c, 10, self.HEIGHT - 22, [("QUEUE", QUEUE), ("THIS PREFILL", PREFILL), ("KV USED", CACHE),
                                          ("PAST SLO", OVER), ("ADMITTED", ADMIT), ("REJECTED", OVER)])
        c.freeze()

    def frame(self, now_s: float, request: int, requests: int, input_tokens: int | None, prefill_queue_s,
              prefill_instance: int | None, prefill_s: float, decode_fraction, predicted_ttft_s: float,
              last_admitted: bool | None, completed: int, rejected_at_arrival: int,
              rejected_after_prefill: int) -> np.ndarray:
        """The picture: the prefill queues (``prefill_s`` stacked on ``prefill_instance``, where the
        pending request would go; None when the episode is over), the decode occupancy per
        instance, the last decision and the running counts."""
        c = self.canvas
        _header(c, now_s, request, requests, f"  INPUT {input_tokens} TOK" if input_tokens is not None else "  DONE")
        width = c.width
        if last_admitted is not None:
            label = "LAST: ADMITTED" if last_admitted else "LAST: REJECTED"
            x = width - 10 - text_width(label) - 16
            c.rect(x, 34, x + 12, 46, ADMIT if last_admitted else OVER)
            c.text(x + 16, 36, label)
        c.text(10, 66, f"COMPLETED {completed}  REJECTED AT ARRIVAL {rejected_at_arrival}  "
                       f"AFTER PREFILL {rejected_after_prefill}")
        if prefill_instance is not None:
            x0, x1 = self.prefill_columns[prefill_instance]
            pad = max(1, (x1 - x0) // 8)
            c.rect(x0 - pad, self.BAR_TOP, x1 + pad, self.BAR_BOTTOM, CHOSEN)
        for i, (x0, x1) in enumerate(self.prefill_columns):
            extra = prefill_s if i == prefill_instance else 0.0
            _stacked_bar(c, x0, x1, self.BAR_TOP, self.BAR_BOTTOM, prefill_queue_s[i], extra, self.slo, QUEUE,
                         PREFILL)
        for i, (x0, x1) in enumerate(self.decode_columns):
            _stacked_bar(c, x0, x1, self.BAR_TOP, self.BAR_BOTTOM, decode_fraction[i], 0.0, 1.0, CACHE, CACHE)
        load = sum(decode_fraction) / len(decode_fraction)
        gx = 20 + text_width("PREDICTED TTFT / SLO") + 12
        c.gauge(gx, 330, width - 20, 340, load, CACHE)
        ratio = predicted_ttft_s / self.slo
        c.gauge(gx, 346, width - 20, 356, ratio, OVER if ratio > 1.0 else QUEUE)
        return c.snapshot()
