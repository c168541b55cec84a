"""test_reports_at_scale.py: the reports of a Hugging Face Llama built from a small config (no
download), 12 layers forward and backward (about 800 tensors), with a bug planted in one
layer's MLP: the verdict line names the culprit before the worst tensor, the text table keeps
every layer index, the HTML page groups tensors by module and labels its chart by layer, and
`numalign dump --at` prints the element a report names."""
import copy
import re

import pytest
import torch

import numalign
from numalign.capture import trace_model

transformers = pytest.importorskip("transformers")

LAYERS, BAD = 12, 7
CULPRIT = f"model.layers.{BAD}.mlp.down_proj"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ref = transformers.LlamaForCausalLM(config).eval()
    test = copy.deepcopy(ref)
    with torch.no_grad():  # a kernel that scales its result by 1.05
        test.model.layers[BAD].mlp.down_proj.weight.mul_(1.05)
    x = {"input_ids": torch.randint(0, 64, (2, 12)), "use_cache": False}
    d = tmp_path_factory.mktemp("llama")
    paths = []
    for role, model, dtype in (("test", test, torch.bfloat16), ("ref", ref, torch.bfloat16),
                               ("truth", ref, torch.float64)):
        paths.append(d / f"{role}.safetensors")
        trace_model(model, x, dtype, save_to=paths[-1])
    return paths


@pytest.fixture(scope="module")
def report(traces):
    return numalign.judge(*traces)


def test_the_verdict_line_names_the_culprit_before_the_worst_tensor(report):
    assert len(report.tensors) > 500
    assert report.first_divergence["forward"]["module"] == CULPRIT
    verdict = str(report).rstrip("\n").splitlines()[-1]
    assert verdict.startswith("NOT ALIGNED: ")
    culprit = verdict.index(f"; culprit: module {CULPRIT} (forward, {CULPRIT}.out)")
    assert culprit < verdict.index("; worst: ")
    assert report.summary["worst"] != f"{CULPRIT}.out", "the worst tensor only inherited it"


def _digits(name):
    return [p for p in name.split(".") if p.isdigit()]


def test_the_text_table_keeps_every_layer_index(report):
    rows = [line for line in str(report).splitlines() if re.match(r"(FAIL|PASS|ERROR) ", line)]
    names = [t["name"] for t in report.tensors][:len(rows)]
    assert len(rows) > 50
    shortened = 0
    for row, name in zip(rows, names):
        shown = row[9:].split(" ")[0]
        assert _digits(shown) == _digits(name), (shown, name)
        assert shown == name or ".." in shown
        shortened += shown != name
    assert shortened > 0, "some names are longer than the column"
    # Verbose: every name whole.
    verbose = report.text(True)
    for name in names:
        assert f"     {name}" in verbose


def test_the_html_groups_by_module_and_labels_layers(report, traces, cli, tmp_path):
    out = tmp_path / "report.html"
    proc = cli("judge", *traces, "--format", "html", "-o", out)
    assert proc.returncode == 1, proc.stderr
    html = out.read_text()
    assert len(html) < 1_500_000
    # The module tree: open on the way to the culprit, every layer a node.
    assert f"<details open><summary><span class=\"v fail\">FAIL</span> <b>layers.{BAD}</b>" in html
    assert "<b>down_proj</b>" in html
    for layer in range(LAYERS):
        assert f"<b>layers.{layer}</b>" in html
    # The ratio chart: forward and backward bands, a tick label per layer at this size.
    chart = html[html.index("<h2>Ratio"):html.index("</svg>")]
    assert ">forward</text>" in chart and ">backward</text>" in chart
    labels = re.findall(r'<text class="tick" x="[\d.]+" y="235.00" text-anchor="middle">(\d+)<', chart)
    assert labels[:LAYERS] == [str(i) for i in range(LAYERS)]


def test_dump_prints_the_element_the_report_names(report, traces, cli):
    failing = next(t for t in report.tensors if t["verdict"] == "fail" and len(t["shape"]) == 3)
    at = ",".join(map(str, failing["max_abs_index"]))
    proc = cli("dump", traces[0], failing["name"], "--at", at, "-n", "5")
    assert proc.returncode == 0, proc.stderr
    marked = [line for line in proc.stdout.splitlines() if line.endswith(" <")]
    assert len(marked) == 1 and marked[0].split()[1] == f"[{at}]"
    value = float(marked[0].split()[3])
    test = numalign.Trace.load(traces[0])[failing["name"]]
    assert value == test[tuple(failing["max_abs_index"])].item()
    proc = cli("dump", traces[0], failing["name"], "--at", "0,0,999", "-n", "5")
    assert proc.returncode == 2 and "out of range for dimension 2" in proc.stderr
