"""The emulated CUDA autocast policy (``mystique.emulation.autocast``) and the DLRM loss it exposed.

On a healthy H100 the numerics validator's ``model_train_deviation`` rows for DLRM in bf16/fp16 were
errors: CUDA autocast refuses ``binary_cross_entropy`` on probabilities, CPU autocast runs it in
fp32. These tests reproduce the refusal under ``--emulate cuda`` and check that DLRM, which now
takes its loss from the logits, trains under it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mystique.validators import numerics
from mystique.workloads import dlrm, make_step

from mystique.emulation import autocast as emu_autocast
from mystique.emulation import differences
from mystique.targets import make_target

LOW = (torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


@pytest.fixture(scope="module")
def cuda_target():
    return make_target("cpu", None, "cuda")


def _probabilities() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p = torch.sigmoid(torch.randn(16, 1, generator=g))
    y = (torch.rand(16, 1, generator=g) < 0.25).float()
    return p, y


def test_the_cuda_profile_lists_the_autocast_ban():
    names = {d.name: d for d in differences("cuda")}
    ban = names["autocast_bans_binary_cross_entropy"]
    assert ban.ops == frozenset({"binary_cross_entropy"})
    assert "autocast_mode.cpp" in ban.documented


@pytest.mark.parametrize("dtype", LOW, ids=lambda d: str(d).removeprefix("torch."))
def test_bce_on_probabilities_under_autocast_raises_the_cuda_message(cuda_target, dtype):
    """The H100 failure of issue 17, reproduced: the exact RuntimeError CUDA autocast raises."""
    p, y = _probabilities()
    with cuda_target.active(), torch.autocast("cpu", dtype=dtype):
        with pytest.raises(RuntimeError) as err:
            F.binary_cross_entropy(p, y)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.BCELoss()(p, y)
    assert str(err.value) == emu_autocast.BCE_UNSAFE_MESSAGE
    assert str(err.value).startswith(
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n")
    # the host itself runs it (CPU autocast lists binary_cross_entropy under fp32): the refusal is the emulation's
    with torch.autocast("cpu", dtype=dtype):
        host = F.binary_cross_entropy(p, y)
    assert host.dtype == torch.float32 and torch.isfinite(host)


def test_bce_outside_autocast_and_bce_with_logits_inside_run_as_on_the_host(cuda_target):
    p, y = _probabilities()
    z = torch.logit(p)
    expected = F.binary_cross_entropy(p, y)
    with cuda_target.active():
        assert torch.equal(F.binary_cross_entropy(p, y), expected)  # no autocast: no ban
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            assert torch.equal(F.binary_cross_entropy(p, y), expected)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = F.binary_cross_entropy_with_logits(z, y)  # "safe to autocast"
            with torch.autocast("cpu", enabled=False):  # a locally disabled region is not autocast
                assert torch.equal(F.binary_cross_entropy(p, y), expected)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_backward_of_bce_is_not_banned(cuda_target):
    """CUDA bans the forward only; a backward run inside an autocast region still works."""
    p, y = _probabilities()
    p.requires_grad_(True)
    with cuda_target.active():
        loss = F.binary_cross_entropy(p, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss.backward()
    assert p.grad is not None and torch.isfinite(p.grad).all()


def test_autocast_state_is_that_of_the_caller_not_of_the_dispatch_mode():
    """Inside __torch_dispatch__ every autocast key is excluded; the snapshot gives the caller's state."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple[bool, bool]] = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.sigmoid.default:
                seen.append((torch.is_autocast_enabled("cpu"), emu_autocast.autocast_enabled_at_call("cpu")))
            return func(*args, **(kwargs or {}))

    x = torch.randn(3)
    with Probe():
        torch.sigmoid(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.sigmoid(x)
    assert seen == [(False, False), (False, True)]
    assert emu_autocast.autocast_enabled_at_call("cpu") is False  # outside any handler: the current state


# ------------------------------------------------------------------------------------- DLRM under it


@pytest.mark.parametrize("dtype", LOW, ids=lambda d: str(d).removeprefix("torch."))
def test_dlrm_train_step_under_autocast_completes_on_the_emulated_gpu(cuda_target, dtype):
    """Failed before DLRM took its loss from the logits (BCE on sigmoid outputs is refused)."""
    step = make_step("dlrm", "debug", "train", seed=0)
    before = {k: v.detach().clone() for k, v in step.model.named_parameters()}
    with cuda_target.active(), torch.autocast("cpu", dtype=dtype):
        loss = step()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(not torch.equal(v, before[k]) for k, v in step.model.named_parameters())
    # the old loss form, BCE on the predicted probabilities, is what the GPU refuses
    with cuda_target.active(), torch.autocast("cpu", dtype=dtype):
        p = dlrm.forward(step.model, step.batch).float()
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, step.batch["labels"])


def test_numerics_model_deviation_of_dlrm_passes_on_the_emulated_gpu(cuda_target):
    """Issue 17: the model_deviation rows of DLRM in bf16 and fp16 (train included) are no errors."""
    df = numerics.run(cuda_target, groups=["model_deviation"], level="quick", seed=0, workloads=["dlrm"],
                      dtypes="bfloat16,float16")
    bad = df[df["status"].isin(["error", "fail"])]
    assert bad.empty, bad[["check", "subject", "dtype", "detail"]].to_string()
    train = df[df["check"] == "model_train_deviation"]
    assert set(train["subject"]) == {"dlrm/loss", "dlrm/gradients"}
    assert set(train["dtype"]) == {"bfloat16", "float16"} and (train["status"] == "pass").all()
