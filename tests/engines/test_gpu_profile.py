"""engine.vllm.profile: the layout ocrd picks for the GPUs it finds (fake GPU descriptions
and a fake nvidia-smi: no GPU here), and how configured keys override it."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import yaml

from ocrd.config.settings import ConfigError, EngineConfig
from ocrd.engines.vllm import profile as gpu_profile
from ocrd.engines.vllm.profile import Gpu, choose, with_profile

H200 = Gpu(0, "NVIDIA H200", 143_771, (9, 0), "GPU-aaaa")
H100 = Gpu(0, "NVIDIA H100 80GB HBM3", 81_559, (9, 0), "GPU-bbbb")
A100_80 = Gpu(0, "NVIDIA A100-SXM4-80GB", 81_920, (8, 0), "GPU-cccc")
L4 = Gpu(0, "NVIDIA L4", 23_034, (8, 9), "GPU-dddd")
RTX4090 = Gpu(0, "NVIDIA GeForce RTX 4090", 24_564, (8, 9), "GPU-eeee")
L40S = Gpu(0, "NVIDIA L40S", 46_068, (8, 9), "GPU-ffff")
T4 = Gpu(0, "Tesla T4", 15_360, (7, 5), "GPU-1111")


def with_index(gpu: Gpu, index: int) -> Gpu:
    return Gpu(index, gpu.name, gpu.memory_mib, gpu.capability, f"{gpu.uuid}-{index}")


def test_a_big_hopper_gpu_gets_two_servers_under_mps_with_the_measured_settings() -> None:
    # as many pages per server as its share of the KV cache holds whole: an H100's share
    # (434,544 tokens measured) holds about 200 pages of ~2,100 tokens, an H200's 384
    for gpu, seqs in ((H200, 384), (H100, 192)):
        p = choose([gpu], cpus=16)
        assert p.name == "hopper-80g"
        assert p.settings == {"mode": "managed", "servers_per_gpu": 2, "api_servers": 8,
                              "max_num_seqs": seqs, "gpu_memory_utilization": 0.85,
                              "gpus": []}
        assert "two servers per GPU" in p.reason and gpu.name in p.reason
        assert f"{seqs} pages each" in p.reason


def test_front_ends_follow_the_cores_beside_each_gpu() -> None:
    assert choose([H200], cpus=8).settings["api_servers"] == 4
    assert choose([H200], cpus=2).settings["api_servers"] == 2  # never fewer than servers
    four = choose([with_index(H200, i) for i in range(4)], cpus=64)
    assert four.settings["api_servers"] == 8 and four.settings["gpus"] == [0, 1, 2, 3]
    assert choose([with_index(H200, i) for i in range(4)], cpus=16).settings["api_servers"] == 2


def test_cards_of_24_to_48_gb_get_one_managed_server_and_others_the_engine_in_ocrd() -> None:
    for gpu in (RTX4090, L4, L40S, A100_80):  # A100: 80 GB but not Hopper: not measured
        p = choose([gpu], cpus=16)
        assert p.name == "gpu-24g", gpu
        assert p.settings["mode"] == "managed" and p.settings["servers_per_gpu"] == 1
    for gpus in ([T4], [], [H200, with_index(L4, 1)]):
        assert choose(gpus, cpus=16).settings == {"mode": "inprocess"}
    assert "different kinds" in choose([H200, with_index(L4, 1)]).reason
    unknown = Gpu(0, "old driver", 143_771, None)  # no compute capability: not Hopper-class
    assert choose([unknown], cpus=16).name == "gpu-24g"


def test_configured_keys_override_the_profile_one_by_one() -> None:
    cfg = EngineConfig.model_validate({"kind": "vllm", "vllm": {
        "max_num_seqs": 200, "gpu_memory_utilization": 0.5}}).vllm
    got = gpu_profile.apply(cfg, choose([H200], cpus=16))
    assert (got.mode, got.servers_per_gpu, got.api_servers) == ("managed", 2, 8)
    assert (got.max_num_seqs, got.gpu_memory_utilization) == (200, 0.5)
    # mode too: a user who wants the engine inside ocrd on an H200 says so
    inproc = EngineConfig.model_validate({"kind": "vllm", "vllm": {"mode": "inprocess"}}).vllm
    got = gpu_profile.apply(inproc, choose([H200], cpus=16))
    assert got.mode == "inprocess" and got.api_servers == 1 and got.max_num_seqs == 384
    # profile none: the keys as configured, nothing inferred
    none = EngineConfig.model_validate({"kind": "vllm", "vllm": {"profile": "none"}}).vllm
    got, profile = gpu_profile.resolve(none, [H200])
    assert profile.name == "none" and got.mode == "inprocess" and got.max_num_seqs == 100


def test_a_key_the_chosen_layout_cannot_take_is_a_config_error_that_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_profile, "detect", lambda: [T4])
    cfg = EngineConfig.model_validate({"kind": "vllm", "vllm": {"api_servers": 4}})
    with pytest.raises(ConfigError, match=r"engine\.vllm\.api_servers = 4: api_servers 4 needs "
                       r"mode: managed"):
        with_profile(cfg)
    monkeypatch.setattr(gpu_profile, "detect", lambda: [H200])
    assert with_profile(cfg).vllm.api_servers == 4


def test_the_choice_is_logged_with_its_reason_and_what_was_overridden(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_profile, "detect", lambda: [H200])
    cfg = EngineConfig.model_validate({"kind": "vllm", "vllm": {"max_num_seqs": 256}})
    with structlog.testing.capture_logs() as logs:
        with_profile(cfg)
    event = next(e for e in logs if e["event"] == "vllm_profile")
    assert event["profile"] == "hopper-80g" and event["mode"] == "managed"
    assert event["overridden"] == ["max_num_seqs"] and "NVIDIA H200" in event["reason"]


def fake_nvidia_smi(folder: Path, rows: str, old_driver: bool = False) -> Path:
    """An nvidia-smi that answers --query-gpu like the real one (csv, noheader, nounits);
    old_driver: it refuses the compute_cap field, as drivers before it did."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"""#!{sys.executable}
import sys
query = next(a for a in sys.argv if a.startswith("--query-gpu="))
if {old_driver!r} and "compute_cap" in query:
    print('Field "compute_cap" is not a valid field to query.', file=sys.stderr)
    sys.exit(2)
for row in {rows!r}.strip().splitlines():
    cells = [c.strip() for c in row.split(",")]
    print(", ".join(cells if "compute_cap" in query else cells[:4]))
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


ROWS = """0, GPU-4f2a, NVIDIA H200, 143771, 9.0
1, GPU-77c1, NVIDIA H200, 143771, 9.0"""


def test_gpus_are_read_from_nvidia_smi_and_cuda_visible_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', ROWS)}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = gpu_profile.detect()
    assert [(g.index, g.name, g.memory_mib, g.capability) for g in gpus] == [
        (0, "NVIDIA H200", 143771, (9, 0)), (1, "NVIDIA H200", 143771, (9, 0))]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.index for g in gpu_profile.detect()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-77c1,0")
    assert [g.index for g in gpu_profile.detect()] == [1, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_profile.detect() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,1")  # CUDA stops at the unknown 7
    assert [g.index for g in gpu_profile.detect()] == [0]


def test_a_driver_without_compute_cap_still_gives_the_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_nvidia_smi(tmp_path / "bin", ROWS, old_driver=True)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = gpu_profile.detect()
    assert [(g.index, g.capability) for g in gpus] == [(0, None), (1, None)]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_profile.detect() == []


@pytest.mark.e2e
def test_check_config_names_the_layout_and_refuses_a_key_it_cannot_take(
        tmp_path: Path) -> None:
    """check-config with engine.kind vllm on a machine whose nvidia-smi shows one 16 GB
    card: in-process; api_servers set without mode is refused with the key named."""
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "0, GPU-1, Tesla T4, 15360, 7.5")
    inbox = {"path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
             "failed": str(tmp_path / "failed"), "on_success": "keep"}
    for name in ("in", "out", "failed"):
        (tmp_path / name).mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if importlib.util.find_spec("vllm") is None:
        # check-config's preflight wants vLLM installed (tests/engines/test_preflight.py);
        # where it is not (./scripts/test --fast), a stand-in package that is never imported
        fake = tmp_path / "fake-vllm"
        (fake / "vllm").mkdir(parents=True)
        (fake / "vllm" / "__init__.py").write_text("raise ImportError('a stand-in')\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake),
                                                          env.get("PYTHONPATH")]))

    def check(vllm: dict) -> subprocess.CompletedProcess:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "engine": {
            "kind": "vllm", "vllm": vllm}, "inboxes": [inbox]}))
        return subprocess.run([sys.executable, "-m", "ocrd", "check-config", "-c", str(path)],
                              capture_output=True, text=True, timeout=60, env=env)

    ok = check({})
    assert ok.returncode == 0, ok.stderr
    assert "vLLM inprocess, profile auto" in ok.stdout
    bad = check({"api_servers": 4})
    assert bad.returncode == 2
    assert "ocrd: engine.vllm.api_servers = 4: api_servers 4 needs mode: managed" in bad.stderr
