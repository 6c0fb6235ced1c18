"""Rules are data: shipped packs load, each example frame is decided by the rule its row names, user TOML
files extend and override the packs, and malformed files fail with a clear RulesError."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from snapanalyze import RulesError, load_rules

EXAMPLES = Path(__file__).parent / "data" / "rule_examples.csv"


def _examples() -> list[dict[str, str]]:
    with open(EXAMPLES, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def test_shipped_packs_load_with_every_category_known(rules):
    assert [s.split("/")[-1] for s in rules.sources] == [
        "torch.toml", "vllm.toml", "sglang.toml", "transformers.toml", "training.toml", "lightning.toml",
        "adapters.toml", "pyg.toml", "generic.toml"]
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
