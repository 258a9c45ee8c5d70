"""Target: device strings, --inject specs, and the mode active only on the device under test."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.errors import EnvironmentUnsupported, UsageError
from mystique.targets import Target, device_info, make_target, resolve_inject


class CountingMode(TorchDispatchMode):
    calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        CountingMode.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def counting_factory():
    return CountingMode()


def test_mode_is_active_only_inside_active():
    CountingMode.calls.clear()
    target = Target("cpu", counting_factory, "tests:counting")
    a = torch.ones(3)
    _ = a + a
    assert CountingMode.calls == []
    with target.active():
        _ = a * 2
    assert any("mul" in c for c in CountingMode.calls)
    n = len(CountingMode.calls)
    _ = a - a
    assert len(CountingMode.calls) == n
    assert target.label == "cpu+tests:counting"
    assert target.without_mode().mode_factory is None


def test_user_mode_factory_by_module_path():
    factory = resolve_inject("test_targets:counting_factory")
    assert isinstance(factory(), CountingMode)
    t = make_target("cpu", "test_targets:counting_factory")
    assert t.label == "cpu+test_targets:counting_factory"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:factory", "cannot import"),
        ("test_targets:missing", "no callable"),
        ("not a spec", "neither a built-in"),
        ("test_targets", "neither a built-in"),
    ],
)
def test_bad_inject_specs_are_usage_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        resolve_inject(spec)


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "meta"])
def test_valid_devices(device):
    assert make_target(device).device == device


def test_malformed_device_is_usage_error_and_absent_device_is_environment_error():
    with pytest.raises(UsageError):
        make_target("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(EnvironmentUnsupported, match="not available"):
            make_target("cuda:0")


def test_device_info_names_the_cpu_and_its_memory():
    info = device_info("cpu")
    assert info.name and info.memory_bytes and info.memory_bytes > 2**28


# --- issue 19: every device string is valid, exit 2 (malformed / unknown type) or exit 3 (absent) --------


@pytest.mark.parametrize("device", ["cuda:-1", "cpu:0x", "CUDA", "Cpu", " cpu", "cpu ", "cpu\n", "cu da", "cuda: 1",
                                    "cpu:00", "cuda:1:2", "", ":0", "cpu:", "cuda:99999999999999999999", "foo",
                                    "metal", "ort", "gpu0", "cpu\x00", "cu\u0000da", "cpu\u2028", "ｃｐｕ", "cpu:٣"])
def test_malformed_or_unknown_device_strings_are_usage_errors(device):
    from mystique.targets import check_device

    with pytest.raises(UsageError, match="unknown device") as info:
        check_device(device)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("device", ["xla", "ipu", "hip", "lazy", "vulkan", "mkldnn", "privateuseone", "hpu",
                                    "fpga:1", "mtia:7"])
def test_device_types_torch_knows_but_this_machine_lacks_are_environment_errors(device):
    from mystique.targets import check_device

    with pytest.raises(EnvironmentUnsupported, match="not available") as info:
        check_device(device)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("device, code", [("cuda:-1", 2), ("cpu:0x", 2), ("CUDA", 2), (" cpu", 2), ("cpu\n", 2),
                                          ("cpu:99999999999999999999", 2), ("nosuch", 2), ("xla", 3)])
def test_the_cli_answers_bad_devices_with_one_line(tmp_path, capsys, device, code):
    from mystique.cli import main

    rc = main(["-q", "capture", "user_steps:tiny_mlp", "-o", str(tmp_path / "o"), "--device", device])
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.startswith("mystique: error: ") and err.count("\n") == 1 and "internal error" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("device", ["cuda:-1", "cpu:99999999999999999999", "CUDA", "cpu\nimport os"])
def test_generate_refuses_malformed_devices_with_exit_2(tmp_path, capsys, device):
    from pathlib import Path

    from mystique.cli import main

    trace = Path(__file__).parent / "data" / "traces" / "pt2_et.json"
    rc = main(["-q", "generate", str(trace), "-o", str(tmp_path / "o"), "--device", device])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "internal error" not in err, err
