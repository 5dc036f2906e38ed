"""The cluster pictures of ``render_mode="rgb_array"`` (``mooncake_gym/envs/viewer.py``), the video
recorder and the ``human`` window."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401
from mooncake_gym.envs import viewer
from mooncake_gym.envs.viewer import AdmissionViewer, Canvas, RoutingViewer

ROUTING = "mooncake_gym/PrefillRouting-v0"
ADMISSION = "mooncake_gym/OverloadAdmission-v0"


def color_at(frame, y, x):
    return tuple(int(c) for c in frame[y, x])


def test_canvas_draws_a_glyph_pixel_for_pixel():
    c = Canvas(16, 16)
    end = c.text(1, 2, "7", scale=1)
    assert end == 1 + 4
    ink = np.all(c.pixels == viewer.INK, axis=2)
    expected = np.zeros((16, 16), bool)
    expected[2, 1:4] = True  # "111"
    expected[3:7, 3] = True  # "001" four times
    assert np.array_equal(ink, expected)
    c.clear()  # back to the frozen (white) background
    assert (c.pixels == 255).all()
    c.text(0, 0, "~", scale=1)  # no glyph: drawn as '#'
    assert np.array_equal(np.all(c.pixels[:5, :3] == viewer.INK, axis=2),
                          np.array([b == "1" for b in viewer._GLYPHS["#"]]).reshape(5, 3))


def test_routing_viewer_bar_heights_are_exact():
    v = RoutingViewer(2, ttft_slo_s=5.0)
    height = v.BAR_BOTTOM - v.BAR_TOP
    frame = v.frame(1.0, 1, 10, 1000, queue_s=[2.5, 0.0], prefill_s=[1.25, 20.0], hit_fraction=[0.5, 0.0],
                    cache_fraction=[0.0, 1.0])
    (a0, a1), (b0, b1) = v.columns
    column_a = [color_at(frame, y, (a0 + a1) // 2) for y in range(v.BAR_TOP, v.BAR_BOTTOM)]
    assert column_a.count(viewer.QUEUE) == height // 2  # 2.5 s of a 5 s scale
    assert column_a.count(viewer.PREFILL) == height // 4
    column_b = [color_at(frame, y, (b0 + b1) // 2) for y in range(v.BAR_TOP, v.BAR_BOTTOM)]
    assert column_b[:4] == [viewer.OVER] * 4  # past the SLO: a red cap
    assert column_b[4:] == [viewer.PREFILL] * (height - 4)
    hit = [color_at(frame, v.HIT_Y + 5, x) for x in range(a0, a1)]
    assert hit.count(viewer.HIT) == round((a1 - a0) / 2)
    assert [color_at(frame, v.CACHE_Y + 5, x) for x in range(b0, b1)] == [viewer.CACHE] * (b1 - b0)
    assert frame.shape == (v.HEIGHT, 640, 3) and frame.dtype == np.uint8


def test_frames_are_fresh_arrays():
    v = RoutingViewer(4, 5.0)
    first = v.frame(0.0, 0, 10, 100, [0.0] * 4, [1.0] * 4, [0.0] * 4, [0.0] * 4)
    second = v.frame(0.0, 1, 10, 100, [3.0] * 4, [1.0] * 4, [0.0] * 4, [0.0] * 4)
    assert not np.array_equal(first, second)  # the first frame was not overwritten


@pytest.mark.parametrize("n_instances", [1, 8, 100, 300])
def test_frame_width_fits_many_instances_and_video_blocks(n_instances):
    v = RoutingViewer(n_instances, 5.0)
    assert v.canvas.width % 16 == 0 and v.canvas.height % 16 == 0
    assert all(x1 > x0 for x0, x1 in v.columns) and v.columns[-1][1] <= v.canvas.width
    frame = v.frame(0.0, 0, 1, 1, [1.0] * n_instances, [0.0] * n_instances, [0.0] * n_instances,
                    [0.5] * n_instances, chosen=n_instances - 1)
    assert frame.shape == (400, v.canvas.width, 3)


@pytest.mark.parametrize("env_id,kwargs", [(ROUTING, {"episode_requests": 60}),
                                           (ROUTING, {"episode_requests": 60, "n_instances": 32}),
                                           (ADMISSION, {"episode_requests": 60})])
def test_env_frames_keep_one_shape_and_dtype_to_the_end(env_id, kwargs):
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    frames = [env.render()]
    env.action_space.seed(0)
    terminated = False
    while not terminated:
        _, _, terminated, _, _ = env.step(env.action_space.sample())
        frames.append(env.render())
    assert {f.shape for f in frames} == {frames[0].shape} and frames[0].shape[2] == 3
    assert all(f.dtype == np.uint8 for f in frames)
    assert len({f.tobytes() for f in frames}) > len(frames) // 2  # the picture moves


def _routing_after(action, before=0):
    """The picture after ``before`` requests sent to instance 0, then one request routed by ``action``."""
    env = gym.make(ROUTING, render_mode="rgb_array", rate=8.0, episode_requests=50)
    env.reset(seed=0)
    for _ in range(before):
        env.step(0)
    _, _, _, _, info = env.step(action)
    return env.render(), env.unwrapped._viewer, info


def test_the_chosen_instance_is_highlighted_and_a_pull_is_marked():
    n = 8
    at_0, v, _ = _routing_after(0)
    at_3, _, _ = _routing_after(3)
    y = v.BAR_TOP + 10
    outside = lambda i: v.columns[i][0] - 1  # the highlight pads the column on both sides
    assert color_at(at_0, y, outside(0)) == viewer.CHOSEN and color_at(at_0, y, outside(3)) == viewer.WHITE
    assert color_at(at_3, y, outside(3)) == viewer.CHOSEN and color_at(at_3, y, outside(0)) == viewer.WHITE
    assert color_at(at_3, v.BAR_TOP + 2, outside(3)) == viewer.CHOSEN
    # after 2 requests on instance 0 the next prompt's first 2,048 tokens are cached there: a pull to 3
    # copies them
    pulled_3, _, info = _routing_after(n + 3, before=2)
    assert info["pull"] and info["fetched_tokens"] > 0
    assert color_at(pulled_3, v.BAR_TOP + 2, outside(3)) == viewer.PULL
    (x0, x1) = v.columns[3]
    assert not np.array_equal(at_0[:, x0:x1], at_3[:, x0:x1])


def _admission_after(actions):
    env = gym.make(ADMISSION, render_mode="rgb_array", load=2.0, episode_requests=400)
    env.reset(seed=0)
    for a in actions:
        env.step(a)
    return env.render(), env.unwrapped


def test_admission_picture_shows_the_last_decision_and_the_decode_pool_filling():
    admitted, env = _admission_after([1])
    rejected, _ = _admission_after([0])
    v = env._viewer
    x = v.canvas.width - 10 - viewer.text_width("LAST: ADMITTED") - 16 + 6
    assert color_at(admitted, 40, x) == viewer.ADMIT
    assert color_at(rejected, 40, x) == viewer.OVER
    busy, env = _admission_after([1] * 300)
    kv_pixels = lambda f: sum(int(np.all(f[v.BAR_TOP:v.BAR_BOTTOM, x0:x1] == viewer.CACHE, axis=2).sum())
                              for x0, x1 in v.decode_columns)
    assert kv_pixels(busy) > kv_pixels(admitted)
    # the instance the pending request would be prefilled on is highlighted
    view = env.decision_view()
    x0, x1 = v.prefill_columns[view.prefill_instance]
    assert color_at(busy, v.BAR_TOP + 2, x0 - 1) == viewer.CHOSEN


def test_record_video_writes_an_mp4(tmp_path):
    pytest.importorskip("moviepy", reason="RecordVideo needs moviepy: pip install 'mooncake-gym[video]'")
    from gymnasium.wrappers import RecordVideo

    for env_id in (ROUTING, ADMISSION):
        env = RecordVideo(gym.make(env_id, render_mode="rgb_array", episode_requests=30),
                          video_folder=str(tmp_path / env_id.split("/")[1]), episode_trigger=lambda e: True,
                          disable_logger=True)
        env.reset(seed=0)
        env.action_space.seed(0)
        terminated = False
        while not terminated:
            _, _, terminated, _, _ = env.step(env.action_space.sample())
        env.close()
        videos = list((tmp_path / env_id.split("/")[1]).glob("*.mp4"))
        assert len(videos) == 1 and videos[0].stat().st_size > 1000


def test_human_mode_opens_a_window_through_gymnasiums_wrapper(monkeypatch):
    pytest.importorskip("pygame", reason="render_mode='human' needs pygame: pip install 'mooncake-gym[human]'")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # no display needed
    from gymnasium.wrappers import HumanRendering

    with pytest.warns(UserWarning, match="HumanRendering"):
        env = gym.make(ROUTING, render_mode="human", episode_requests=5)
    wrapper = env
    while not isinstance(wrapper, HumanRendering):
        wrapper = wrapper.env
    env.metadata["render_fps"] = 1000  # do not sleep between frames in a test
    env.reset(seed=0)
    env.step(0)
    assert env.unwrapped.render_mode == "rgb_array"
    assert wrapper.window is not None  # a frame was shown
    env.close()


def test_direct_construction_names_the_render_mode():
    from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv

    with pytest.raises(ValueError, match="render_mode"):
        PrefillRoutingEnv(render_mode="human")
