"""The five causes of the H100's false failures (2026-11-25), checked on a real CUDA device.

The tests of issue 21 (soft errors on the GPU: the checked Linear on the device's own kernel,
EmbeddingBag, protect(), CUDA graphs, SDC repeat cases, campaigns) follow them.

Each test mirrors one of the emulated tests (``tests/test_emulation_*.py``) on the hardware: it runs
where ``torch.cuda.is_available()`` and is skipped, saying why, elsewhere (``tests/conftest.py``).
"""

from __future__ import annotations

import pytest

from mystique.targets import make_target

pytestmark = pytest.mark.cuda

BAD = ("fail", "error", "inconclusive")


def _bad(df):
    return df[df["status"].isin(BAD)][["check", "subject", "dtype", "detail"]]


def test_reduction_bounds_hold_on_cuda():
    """Cause 1: scans and reductions in the GPU's own order stay within the derived bounds."""
    from mystique.validators import numerics

    df = numerics.run(make_target("cuda"), groups=["op_sweep"], level="quick", seed=0,
                      ops="cumsum,sum,mean,softmax,log_softmax,layer_norm,rms_norm,cross_entropy,embedding_bag")
    assert len(df) and _bad(df).empty, _bad(df).to_string()


def test_sdpa_backends_without_an_fp32_kernel_are_skips_on_cuda():
    """Cause 2: flash/cuDNN attention have no fp32 kernel: a skip with torch's reason, never an error."""
    from mystique.validators import numerics

    df = numerics.run(make_target("cuda"), groups=["op_sweep"], level="quick", seed=0,
                      ops="scaled_dot_product_attention")
    assert _bad(df).empty, _bad(df).to_string()
    fp32_flash = df[df["subject"].str.startswith("scaled_dot_product_attention/flash") & (df["dtype"] == "float32")]
    assert len(fp32_flash) and (fp32_flash["status"] == "skip").all()


def test_dlrm_trains_under_cuda_autocast():
    """Cause 3: DLRM's loss is computed on logits, which CUDA autocast accepts."""
    from mystique.validators import numerics

    df = numerics.run(make_target("cuda"), groups=["model_deviation"], level="quick", seed=0,
                      dtypes="bfloat16,float16")
    assert len(df) and _bad(df).empty, _bad(df).to_string()


def test_integer_checksums_run_on_cuda():
    """Cause 4: no int64 GEMM on CUDA; the exact integer checks run all the same."""
    from mystique.validators import soft_errors

    df = soft_errors.run(make_target("cuda"), groups=["abft_gemm", "false_positives", "detection_campaign"],
                         level="quick", seed=0)
    assert len(df) and _bad(df).empty, _bad(df).to_string()


def test_embedding_bag_auxiliary_outputs_are_not_compared_across_devices(tmp_path):
    """Cause 5: offset2bag/bag_size/max_indices are backend-specific; output 0 is compared."""
    from mystique.validators import correctness

    df = correctness.run(make_target("cuda"), level="quick", seed=0, out_dir=tmp_path, workloads="dlrm")
    assert len(df) and _bad(df).empty, _bad(df).to_string()


# ----------------------------------------------------------------------------- issue 21: soft errors on the GPU

def _corrupt(t, i, j, size=2.0**-4):
    t[i, j] += t.abs().max() * size + 1.0  # far above any clean rounding of the path's bound
    return t


@pytest.mark.parametrize("dtype", ["float32", "tf32", "bfloat16", "float16"])
def test_checked_linear_checks_the_devices_own_gemm_on_cuda(dtype):
    """Priority 1: the checked Linear runs the device's kernel (fp32, TF32, the half GEMM with fp32 output),
    raises no alarm on clean products and locates a corrupted accumulator element."""
    import torch
    from mystique.validators.soft_errors import abft
    from mystique.validators.soft_errors.abft import device_linear as dl

    dt = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        for m, k, n in [(1, 7, 3), (64, 4096, 512), (333, 1000, 77), (8192, 256, 1024)]:
            x = torch.randn(m, k, device="cuda", generator=g).to(dt)
            w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(dt)
            b = torch.randn(n, device="cuda", generator=g).to(dt)
            _, rep = abft.checked_linear(x, w, b)
            assert not rep.alarm and rep.checked, rep.describe()
            enc = dl.encode_device_linear(w, b)
            _, chk = dl.device_linear(x, enc)
            assert chk.path.kind == {"float32": "fp32", "tf32": "tf32"}.get(dtype, "fp32_out")
            # TF32 reads the operands to 2^-10: a row's bound over 4096 x 512 products is some units, and
            # the H100 passed an fp32-sized corruption (max/16 + 1) at 0.37 of it; an exponent-sized one
            acc = _corrupt(torch.nn.functional.linear(x.float(), w.float(), b.float()), m // 2, n // 3,
                           16.0 if dtype == "tf32" else 2.0**-4)
            bad = dl.check_device_linear(enc, x, acc, chk.path).report()
            assert bad.alarm and bad.location == (m // 2, n // 3), bad.describe()
    finally:
        torch.set_float32_matmul_precision(old)


def test_protect_on_a_cuda_model_in_training_and_inference():
    """Priority 3: protect() on a CUDA model: no alarm in training or inference, a flip is caught."""
    import torch
    from mystique.validators.soft_errors import protect
    from torch import nn

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda().to(dtype)
        bag = nn.EmbeddingBag(10000, 64, mode="sum").cuda()
        opt = torch.optim.SGD([*model.parameters(), *bag.parameters()], lr=1e-3)
        x = torch.randn(256, 512, device="cuda").to(dtype)
        idx = torch.randint(0, 10000, (4096,), device="cuda")
        off = torch.arange(0, 4096, 16, device="cuda")
        with protect(model) as g1, protect(bag) as g2:
            for _ in range(5):
                (model(x).float().square().mean() + bag(idx, off).square().mean()).backward()
                opt.step()
                opt.zero_grad()
            with torch.no_grad():
                for _ in range(5):
                    model(x), bag(idx, off)
            assert g1.checks == 20 and g2.checks == 10 and not g1.alarms and not g2.alarms, (g1.alarms, g2.alarms)
            handle = model[0].register_forward_hook(lambda m, i, o: [o.view(-1)[77].add_(1e4)] and None, prepend=True)
            with torch.no_grad():
                model(x)
            handle.remove()
            assert [a.module for a in g1.alarms] == ["0"], g1.alarms


def test_protect_refuses_cuda_graph_capture():
    """Priority 3: a protected module inside CUDA graph capture is refused with one line."""
    import torch
    from mystique.validators.soft_errors import protect
    from torch import nn

    from mystique.errors import UsageError

    model = nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        model(x)  # warm-up outside the guard, as CUDA graphs want
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with protect(model), torch.no_grad(), pytest.raises(UsageError, match="CUDA graph capture"):
        with torch.cuda.graph(graph):
            model(x)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_checked_embedding_bags_on_cuda(mode):
    """Priority 2: fp32 and 8-bit row-wise EmbeddingBag checked on the device (torch-op path)."""
    import torch
    from mystique.validators.soft_errors import abft
    from mystique.validators.soft_errors.abft.bag_verdict import device_bag_output

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(100000, 128, generator=g).cuda()
    idx = torch.randint(0, 100000, (65536,), generator=g).cuda()
    off = torch.arange(0, 65536, 32).cuda()
    table = abft.checked_table(weight)
    out, rep = abft.checked_embedding_bag(table, idx, off, mode)
    assert not rep.alarm and rep.checked, rep.describe()
    q = abft.QuantizedTable.from_float(weight)
    qout, qrep = abft.checked_quantized_embedding_bag(q, idx, off, mode)
    want = torch.nn.functional.embedding_bag(idx, q.dequantize(), off, mode=mode)
    assert not qrep.alarm and torch.allclose(qout, want, rtol=1e-5, atol=1e-4), qrep.describe()
    bad = out.clone()
    bad[5, 9] += 1.0
    assert device_bag_output(bad, table.checks, idx, off, mode).report().rows == [5]


def test_sdc_screen_names_bit_exact_and_bounded_repeats_on_cuda():
    """Priority 5: deterministic kernels repeat bit-exactly; index_add and the embedding backward (atomics)
    are compared within a derived bound, and the row says which."""
    from mystique.validators import soft_errors

    df = soft_errors.run(make_target("cuda"), groups=["sdc_screen"], level="quick", seed=0)
    assert len(df) and _bad(df).empty, _bad(df).to_string()
    rows = df[df["metric"] == "mismatched_runs"].set_index("subject")
    # (one row per dtype of a kernel: .loc with a list keeps every one; the H100 had two gemm_256 rows)
    assert all("bit-exact" in d for d in rows.loc[["gemm_256"], "detail"])
    assert all("within 2x the fp64 bound" in d for d in rows.loc[["index_add_256x32"], "detail"])


def test_soft_error_campaigns_run_on_the_device():
    """Priority 4: detection, false-positive and PVF campaigns on the GPU, every row clean."""
    from mystique.validators import soft_errors

    df = soft_errors.run(make_target("cuda"), groups=["detection_campaign", "false_positives", "pvf"], level="quick",
                         seed=0)
    assert len(df) and _bad(df).empty, _bad(df).to_string()


# ----------------------------------------------------------------------------- issue 33: CPU placement


def test_auto_placement_on_cuda_prefers_the_gpus_numa_node_and_pins_the_timing_thread():
    """--cpu-affinity auto on a GPU host: the main thread on one allowed CPU, among the GPU's NUMA-local CPUs
    where sysfs names them (a host without that file places among all allowed CPUs), masks restored after."""
    import os
    import threading

    from mystique import placement

    before = os.sched_getaffinity(0)
    near = placement.device_local_cpus("cuda")
    with placement.placed("auto", "cuda") as pl:
        rec = pl.record
        if len(before) < 2:
            assert not rec["applied"]
            return
        assert rec["applied"] and os.sched_getaffinity(threading.get_native_id()) == {rec["main_cpu"]}
        if near and set(near) & before:
            assert rec["main_cpu"] in near and rec["near_device"] == placement.format_cpu_list(near)
    assert os.sched_getaffinity(threading.get_native_id()) == before
