"""Rules are data: shipped packs load, each example frame is decided by the rule its row names, user TOML
files extend and override the packs, and malformed files fail with a clear RulesError."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze import RulesError, load_rules
from snapanalyze.cli import main

EXAMPLES = Path(__file__).parent / "data" / "rule_examples.csv"
REAL_SNAPSHOT = Path(__file__).resolve().parents[2] / "fixtures" / "real" / "cs336-forward-bf16-t2.6.pickle"


def _examples() -> list[dict[str, str]]:
    with open(EXAMPLES, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def test_shipped_packs_load_with_every_category_known(rules):
    assert [s.split("/")[-1] for s in rules.sources] == [
        "torch.toml", "kernels.toml", "vllm.toml", "sglang.toml", "transformers.toml", "timm.toml", "training.toml",
        "lightning.toml", "adapters.toml", "pyg.toml", "generic.toml"]
    assert set(rules.categories) >= {"weights", "kv_cache", "attention", "fallback_kernel", "mlp",
                                     "vision_encoder", "logits", "graph_capture", "concurrent_request",
                                     "communication", "workspace", "gradients", "optimizer_state", "inputs",
                                     "other"}
    assert all(r.reason for r in rules.rules)
    assert len({r.name for r in rules.rules}) == len(rules.rules)


@pytest.mark.parametrize("row", _examples(), ids=lambda r: f"{r['rule'] or r['category']}:{r['function'][:30]}")
def test_example_frame_is_decided_by_its_rule(rules, row):
    filename = row["filename"].replace("\\", "/")
    plumbing, matched = rules.match_frame(filename, row["function"])
    if row["category"] == "plumbing":
        assert plumbing
    elif row["category"] == "none":
        assert not plumbing and not matched
    else:
        assert not plumbing
        first = rules.rules[matched[0]]
        assert (first.name, first.category) == (row["rule"], row["category"])


def test_linear_frames_do_not_decide(rules):
    """qkv_proj, gate_up_proj and lm_head share linear.py: it must never name a category."""
    path = "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/linear.py"
    plumbing, matched = rules.match_frame(path, "forward")
    assert not matched


def test_user_file_adds_category_rule_and_disables_a_shipped_rule(tmp_path, rules):
    victim = next(r.name for r in rules.rules if r.pack == "vllm")
    user = tmp_path / "mine.toml"
    user.write_text(f'''
disable = ["{victim}"]

[[categories]]
name = "rope_cache"
precedence = 55
owner = "innermost"

[[rules]]
name = "mine.rope"
category = "rope_cache"
reason = "our rotary cache"
file = '(^|/)mymodel/rope\\.py$'

[[rules]]
name = "mine.linear_is_mlp"
category = "mlp"
reason = "in our model every linear is an MLP projection"
file = '(^|/)vllm/model_executor/layers/linear\\.py$'
''')
    mine = load_rules(user)
    assert mine.sources[0] == str(user)
    assert victim not in {r.name for r in mine.rules}
    assert mine.categories["rope_cache"].precedence == 55
    _, matched = mine.match_frame("/src/mymodel/rope.py", "build")
    assert mine.rules[matched[0]].name == "mine.rope"
    _, matched = mine.match_frame("/x/dist-packages/vllm/model_executor/layers/linear.py", "forward")
    assert mine.rules[matched[0]].name == "mine.linear_is_mlp"


@pytest.mark.parametrize("text, problem", [
    ("this is = not toml [", "not valid TOML"),
    ('[[rules]]\nname = "x"\ncategory = "nope"\nreason = "r"\nfile = "a"\n', "unknown category 'nope'"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nreason = "r"\nfile = "(unclosed"\n', "not a valid regex"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nreason = "r"\n', "at least one of 'file' or 'function'"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nfile = "a"\n', "needs a one-line 'reason'"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nreason = "r"\nfile = "a"\nline = 3\n', "unknown key(s) ['line']"),
    ('disable = ["no.such.rule"]\n', "unknown rule(s): no.such.rule"),
    ('[[categories]]\nname = "c"\nowner = "sideways"\n', "owner one of"),
    ('colour = "red"\n', "unknown top-level key(s) ['colour']"),
    ('[[categories]]\nname = "c"\ncolour = "#ff0000"\n', "unknown key(s) ['colour']"),
    ('[[categories]]\nname = "c"\ncolor = "#ff0000"\n', "color is set by the shipped categories.toml only"),
    ('[pack]\nscope = "everywhere"\n', "scope 'everywhere' is not one of ['user_code']"),
    ('[pack]\nname = "mine"\nlevel = 3\n', "[pack] allows name, description, order and scope"),
])
def test_malformed_rules_file_names_file_and_problem(tmp_path, text, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RulesError) as err:
        load_rules(path)
    assert str(path) in str(err.value) or "rule" in str(err.value)
    assert problem in str(err.value)


def test_missing_rules_file_is_a_clear_error(tmp_path):
    with pytest.raises(RulesError, match="cannot read the rules file"):
        load_rules(tmp_path / "absent.toml")


def test_a_rules_file_that_is_not_text_is_a_clear_error(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[[rules]]\nname = "caf\xe9"\n')
    with pytest.raises(RulesError, match=r"latin1\.toml: not UTF-8 text \(byte 21\)"):
        load_rules(path)
    result = CliRunner().invoke(main, ["attribute", str(REAL_SNAPSHOT), "--rules", str(path)])
    assert result.exit_code == 2 and "not UTF-8 text" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("text, problem", [
    ('[[plumbing]]\nname = "x"\nreason = "r"\nclass = "A"\n', "plumbing matches on 'file' and 'function' only"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nreason = "r"\ncode = "a"\nwhere = "outer"\n', "'where' must be"),
    ('[[rules]]\nname = "x"\ncategory = "mlp"\nreason = "r"\ncall = "a"\nconfirm = "yes"\n', "'confirm' must be"),
    ('[[modules]]\nname = "m"\ncategory = "mlp"\nreason = "r"\n', "at least one of 'path' or 'class'"),
    ('[[modules]]\nname = "m"\ncategory = "nope"\nreason = "r"\npath = "x"\n', "unknown category 'nope'"),
    ('[[modules]]\nname = "m"\ncategory = "mlp"\nreason = "r"\npath = "x"\nfile = "y"\n', "unknown key(s) ['file']"),
])
def test_malformed_source_and_module_rules_name_the_problem(tmp_path, text, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=re.escape(problem)):
        load_rules(path)


def test_user_rules_key_on_the_source_and_on_module_spans(tmp_path):
    user = tmp_path / "mine.toml"
    user.write_text('''
[[rules]]
name = "mine.router"
category = "mlp"
reason = "our MoE router"
class = '^Router$'

[[modules]]
name = "mine.router_span"
category = "mlp"
reason = "our MoE router module"
path = '(^|\\.)router$'
''')
    mine = load_rules(user)
    assert mine.rules[0].needs_source and mine.rules[0].name == "mine.router"
    assert mine.modules[0].name == "mine.router_span" and mine.modules[0].match("model.layers.0.router", "A.B") == 3
    assert mine.modules[0].match("model.layers.0.router_norm", "A.B") is None


def test_a_pack_scope_limits_its_rules_to_the_program_s_own_code(tmp_path, rules):
    generic = [r for r in rules.rules if r.pack == "generic"]
    assert generic and all(r.scope is not None for r in generic)        # one scope, not a copied regex
    assert all(r.scope is None for r in rules.rules if r.pack != "generic")
    (tmp_path / "mine.toml").write_text(
        '[pack]\nname = "mine"\nscope = "user_code"\n'
        '[[rules]]\nname = "mine.rope"\ncategory = "attention"\nreason = "rotary cache"\nfunction = "^rope$"\n')
    rope = load_rules(tmp_path / "mine.toml").rules[0]
    assert rope.name == "mine.rope"
    assert rope.matches("/home/me/model/layers.py", "rope")
    assert not rope.matches("/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", "rope")
    assert not rope.matches("libc10_cuda.so", "rope")                     # not Python: not the program's code


def test_shipped_packs_are_discovered_in_the_order_they_declare(tmp_path, monkeypatch):
    """A pack file added to rulepacks/ is read without being listed anywhere; `[pack] order` places it."""
    import shutil
    from importlib import resources

    import snapanalyze.analyze.rules as rules_module
    import snapanalyze.tomldata as tomldata
    shipped = Path(str(resources.files("snapanalyze.analyze")))
    copy = tmp_path / "analyze"
    shutil.copytree(shipped, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__", "attribute"))
    (copy / "rulepacks" / "early.toml").write_text(
        '[pack]\nname = "early"\norder = 5\n'
        '[[rules]]\nname = "early.rope"\ncategory = "attention"\nreason = "rotary cache"\nfunction = "^rope$"\n')
    monkeypatch.setattr(tomldata.resources, "files", lambda _: copy)
    found = rules_module._build_rules(None)
    assert found.sources[0] == "rulepacks/early.toml" and found.rules[0].name == "early.rope"
    (copy / "rulepacks" / "late.toml").write_text('[pack]\nname = "late"\n')
    with pytest.raises(RulesError, match="late.toml: a shipped pack declares its \\[pack\\] order"):
        rules_module._build_rules(None)


def test_plots_draw_categories_in_the_colours_the_categories_file_gives(rules):
    from snapanalyze.plots import category_color
    assert all(c.color for c in rules.categories.values())
    assert {name: category_color(name) for name in rules.categories} == \
        {c.name: c.color for c in rules.categories.values()}
    assert category_color("mine", ["mine"]) not in {c.color for c in rules.categories.values()}


@pytest.mark.parametrize("doc, problem", [
    ({}, "needs [[engines]] tables"),
    ({"engines": [{"name": "x", "label": "X", "frame": []}]}, "unknown key(s) ['frame']"),
    ({"engines": [{"name": "x"}]}, "engine 'x': label: must be a non-empty string"),
    ({"engines": [{"name": "x", "label": "X", "frames": [{"file": "/x/"}]}]}, "unknown key(s) ['file']"),
    ({"engines": [{"name": "x", "label": "X", "categories": "weights"}]}, "categories: must be a list of strings"),
])
def test_the_engines_table_is_checked(doc, problem):
    from snapanalyze.analyze.engine import check_engines, engine_specs
    assert [e["name"] for e in engine_specs()][:2] == ["vllm", "sglang"]          # the shipped one passes
    with pytest.raises(RulesError, match=r"^engines\.toml: .*" + re.escape(problem)):
        check_engines(doc, "engines.toml")


@pytest.mark.parametrize("doc, problem", [
    ({"pytorch": {"chunk": "c", "isolate": "i"}}, "activations: must be a list of strings"),
    ({"activations": [], "vllm": {"chunk": "c"}}, "needs a [pytorch] table"),
    ({"activations": [], "pytorch": {"chunk": "c"}}, "[pytorch]: isolate: must be a non-empty string"),
    ({"activations": [], "pytorch": {"chunk": "c", "isolate": "i", "knobs": 1}}, "unknown key(s) ['knobs']"),
    ({"activations": [], "pytorch": {"chunk": "c", "isolate": "i", "categories": {"mlp": 3}}},
     "categories: mlp: must be a non-empty string"),
])
def test_the_advice_table_is_checked(doc, problem):
    from snapanalyze.analyze.engine import engine_specs
    from snapanalyze.report.oom_text import _advice_table, check_advice
    shipped = _advice_table()
    assert {e["name"] for e in engine_specs()} <= set(shipped)       # every engine has advice of its own
    with pytest.raises(RulesError, match=re.escape(problem)):
        check_advice(doc, "advice.toml")


def test_which_categories_are_state_that_lives_across_steps_is_data(tmp_path):
    """`persistent` in categories.toml (not a Python tuple): the shipped state categories, and a user's own
    category marked so keeps its frames' decision against a block-level signal (here: another request's
    tensors, which otherwise become concurrent_request)."""
    assert load_rules().persistent == {"weights", "kv_cache", "graph_capture", "gradients", "optimizer_state"}
    scenario = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "concurrent_requests.pickle"
    rules = tmp_path / "mine.toml"
    found = {}
    for persistent in ("false", "true"):
        rules.write_text(f'[[categories]]\nname = "my_scores"\npersistent = {persistent}\n'
                         '[[rules]]\nname = "mine.scores"\ncategory = "my_scores"\nreason = "the scoring cache"\n'
                         'function = "^score$"\n')
        assert load_rules(rules).categories["my_scores"].persistent is (persistent == "true")
        result = CliRunner().invoke(main, ["attribute", str(scenario), "--rules", str(rules), "--format", "json"])
        assert result.exit_code == 0, result.output
        found[persistent] = {c["category"]: c["bytes"] for d in json.loads(result.stdout)["devices"]
                             for c in d["categories"]}
    moved = found["false"]["concurrent_request"]                   # req=B's scores, from the snapshot's metadata
    assert moved > 7 << 30 and "concurrent_request" not in found["true"]
    assert found["true"]["my_scores"] == found["false"].get("my_scores", 0) + moved
    rules.write_text('[[categories]]\nname = "my_scores"\npersistent = "yes"\n')
    with pytest.raises(RulesError, match="category 'my_scores': persistent must be true or false"):
        load_rules(rules)
