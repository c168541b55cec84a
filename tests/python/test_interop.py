"""test_interop.py: our traces against the reference safetensors package, both ways."""
import json

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

# Every dtype torch and safetensors 0.8 share.
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32,
          torch.int64, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(0, min(info.max, 1000), shape, generator=g, dtype=torch.int64).to(dtype)


def test_pack_reproduces_save_file_byte_for_byte(cli, tmp_path):
    tensors = {f"t{i}.{str(d).split('.')[-1]}": sample(d, (3, 5), i) for i, d in enumerate(DTYPES)}
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros((0, 4), dtype=torch.bfloat16)
    tensors['odd "name" \\ ü\n\t'] = torch.ones(2)
    src, out = tmp_path / "ref.safetensors", tmp_path / "ours.safetensors"
    save_file(tensors, src, metadata={"format": "pt"})  # one key: the reference's map order is random
    proc = cli("pack", src, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == src.read_bytes()


def test_reference_loads_our_traces(examples, cli):
    path = examples / "allreduce" / "fused.safetensors"
    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["numalign"])
        assert meta["role"] == "test" and meta["dtype_recipe"] == "bf16"
        assert meta["order"] == list(f.keys()) or sorted(meta["order"]) == sorted(f.keys())
        t = f.get_tensor("out.magnitude_16")
    assert t.dtype == torch.bfloat16 and t.shape == (4096,)
    dumped = cli("dump", path, "out.magnitude_16", "-n", "4096").stdout.split("\n")
    values = [float(line.split()[2]) for line in dumped if line]
    assert values == t.double().tolist()


def test_every_dtype_judges_and_inspects(cli, tmp_path):
    tensors = {str(d).split(".")[-1]: sample(d, (64,), 7) for d in DTYPES}
    path = tmp_path / "all.safetensors"
    save_file(tensors, path)
    inspected = cli("inspect", path)
    assert inspected.returncode == 0, inspected.stderr
    for name in tensors:
        assert name in inspected.stdout
    compared = cli("compare", path, path, "--format", "json")
    assert compared.returncode == 0, compared.stdout
    report = json.loads(compared.stdout)
    assert report["summary"]["passed"] == len(DTYPES)
    assert load_file(path)["bfloat16"].dtype == torch.bfloat16


def test_judge_needs_no_numalign_metadata(cli, tmp_path):
    truth = torch.randn(2048, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = truth.to(torch.bfloat16)
    test = (truth * (1 + 2 ** -9)).to(torch.bfloat16)
    for role, t in (("truth", truth), ("ref", ref), ("test", test)):
        save_file({"y": t}, tmp_path / f"{role}.safetensors")
    proc = cli("judge", tmp_path / "test.safetensors", tmp_path / "ref.safetensors",
               tmp_path / "truth.safetensors", "--format", "json")
    report = json.loads(proc.stdout)
    assert report["tensors"][0]["name"] == "y"
    assert report["tensors"][0]["verdict"] in ("pass", "fail")
    assert proc.returncode == (0 if report["aligned"] else 1)
