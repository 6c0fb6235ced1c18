"""The zoo's ground truth: the category every live block should get, from what the capture knows of it.

Contract: `Mapping.load()` reads `truth.toml` (the one documented mapping of module classes, module paths, ops,
autograd nodes and functions to categories); `mapping.label(facts)` returns (label, why) for one
`snapanalyze.collect.cpu.truth.BlockFacts`. The order of the decision:

1. What the block is across steps, from the objects (`collect.cpu.truth.lifecycle`): weights, gradients,
   optimizer_state, kv_cache, inputs or workspace — that is its label.
2. Otherwise it is an activation (made by a forward, or by the backward of what a forward made — then the forward
   call's modules, stack and ops decide), and, strongest first:
   - fallback_kernel: a materialised attention score / probability block (its trailing dims and size are those of
     a softmax output of the attention call it was made in, `facts.scores`) under attention, or any block
     scaled_dot_product_attention's math fallback or an eager attention function (`eager_functions`) made (its
     scaled query, mask, scores, the copies its matmuls make: what a fused kernel avoids);
   - vision_encoder: made while a vision tower of a multimodal model ran (any enclosing module);
   - logits: a log-softmax / NLL / cross-entropy op or its backward node, a loss or sampling function of the
     program's stack outside op modules, or the output head's module path (lm_head);
   - attention / mlp (/ logits): the innermost module whose class the mapping names;
   - activations_other: nothing names it (residuals, norms, embeddings, convolutions).
The mapping is data, written once from the libraries' own module classes; nothing in it is an attribution rule
(the rules never read it), and no entry is keyed on a program's file, line or size.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapanalyze.collect.cpu.truth import BlockFacts, lifecycle

HERE = Path(__file__).parent
OP_CATEGORIES = ("attention", "mlp", "logits")


@dataclass(frozen=True)
class Mapping:
    classes: dict[str, str]                 # qualified class name → category
    class_patterns: tuple[tuple[re.Pattern[str], str], ...]
    paths: tuple[tuple[re.Pattern[str], str], ...]      # innermost module path → category
    ops: dict[str, str]                     # aten op name (without overload) → category
    nodes: tuple[tuple[re.Pattern[str], str], ...]      # autograd node name → category
    functions: tuple[tuple[re.Pattern[str], str], ...]  # "file:function" of the stack → category
    attention_functions: re.Pattern[str] | None         # functions whose allocations are attention's (SDPA math)
    eager_functions: re.Pattern[str] | None = None      # attention functions without a fused kernel

    @classmethod
    def load(cls, program: str | None = None, path: Path = HERE / "truth.toml") -> Mapping:
        """The mapping for one program ("family/name"): entries with `programs` apply to those programs only."""
        doc = tomllib.loads(path.read_text())
        classes: dict[str, str] = {}
        patterns, paths, nodes, functions = [], [], [], []
        ops: dict[str, str] = {}

        def mine(item: dict[str, Any]) -> bool:
            return "programs" not in item or program in item["programs"]
        for key in ("modules", "ops", "functions"):
            doc[key] = [item for item in doc.get(key, []) if mine(item)]
        for item in doc.get("modules", []):
            cat = item["category"]
            for name in item.get("classes", []):
                classes[name] = cat
            for pat in item.get("class_patterns", []):
                patterns.append((re.compile(pat), cat))
            for pat in item.get("paths", []):
                paths.append((re.compile(pat), cat))
        for item in doc.get("ops", []):
            for name in item.get("ops", []):
                ops[name] = item["category"]
            for pat in item.get("nodes", []):
                nodes.append((re.compile(pat), item["category"]))
        for item in doc.get("functions", []):
            for pat in item.get("functions", []):
                functions.append((re.compile(pat), item["category"]))
        attention = doc.get("attention_functions")
        eager = doc.get("eager_functions")
        return cls(classes, tuple(patterns), tuple(paths), ops, tuple(nodes), tuple(functions),
                   re.compile(attention) if attention else None, re.compile(eager) if eager else None)

    def _function(self, code: tuple[Any, ...], classes: tuple[str, ...]) -> tuple[str, str, str] | None:
        """A mapped function inside the innermost module call of the stack (before its first `_call_impl`), or
        inside the one around it where the innermost is one of torch.nn's own layers that the mapping does not
        name (the Dropout or Linear an `nn.TransformerEncoderLayer._ff_block` calls is its feed-forward's)."""
        calls = 2 if classes and classes[-1].startswith("torch.nn.modules.") and \
            self.class_category(classes[-1]) is None else 1
        for file, _, fn in code:
            if fn == "_call_impl" and file.endswith("torch/nn/modules/module.py"):
                calls -= 1
                if not calls:
                    return None
            cat = next((cat for pat, cat in self.functions if pat.search(f"{file}:{fn}")), None)
            if cat is not None:
                return cat, file, fn
        return None

    def class_category(self, name: str) -> str | None:
        hit = self.classes.get(name)
        if hit is None:
            hit = next((cat for pat, cat in self.class_patterns if pat.search(name)), None)
        return hit

    def label(self, f: BlockFacts) -> tuple[str, str]:
        life = lifecycle(f)
        if life != "activations":
            roles = ", ".join(sorted(f.roles)) or f.context.phase
            return life, f"{life}: {roles}"
        classes = f.classes
        cats = [(c, self.class_category(c)) for c in classes]
        vision = next((c for c, cat in cats if cat == "vision_encoder"), None)
        inner = next(((c, cat) for c, cat in reversed(cats) if cat in OP_CATEGORIES), None)
        code = f.forward_code if f.context.phase == "backward" and f.forward is not None else f.code
        ctx = f.context
        op = ctx.op.split(".")[1] if ctx.op.count(".") >= 2 else ctx.op
        functions = [ctx.function, f.forward.function if f.forward is not None else ""]
        in_attention_function = self.attention_functions is not None and (
            any(self.attention_functions.search(f"{file}:{fn}") for file, _, fn in code)
            or any(self.attention_functions.search(f"torch:{fn}") for fn in functions if fn))
        attention_ctx = (inner is not None and inner[1] == "attention") or in_attention_function
        if f.scores and attention_ctx:
            return "fallback_kernel", "a materialised attention score/probability block (softmax-shaped)"
        if ctx.function == "scaled_dot_product_attention" and "_scaled_dot_product_" not in ctx.op:
            return "fallback_kernel", "made by scaled_dot_product_attention's math fallback (not a fused kernel)"
        eager = self.eager_functions
        if eager is not None and any(eager.search(f"{file}:{fn}") for file, _, fn in code):
            return "fallback_kernel", "made by an eager attention function (not a fused kernel)"
        if vision is not None:
            return "vision_encoder", f"made while the vision tower ran ({vision.rsplit('.', 1)[-1]})"
        if ctx.phase == "backward":
            by_node = next((cat for pat, cat in self.nodes if pat.search(ctx.node)), None)
            if by_node == "logits":
                return "logits", f"the backward of a log-softmax / loss over logits ({ctx.node})"
        elif self.ops.get(op) == "logits":
            return "logits", f"a log-softmax / loss op over logits ({op})"
        by_function = self._function(code, classes)
        if by_function is not None:
            return by_function[0], f"made in {by_function[2]} ({by_function[1].rsplit('/', 1)[-1]})"
        path = f.module
        by_path = next((cat for pat, cat in self.paths if pat.search(path)), None) if path else None
        if by_path is not None:
            return by_path, f"made in module {path}"
        if inner is not None:
            return inner[1], f"made in {inner[0].rsplit('.', 1)[-1]} ({f.module})"
        if in_attention_function:
            return "attention", "made in an attention function"
        return "activations_other", f"an activation of {f.module or 'code outside modules'} that no mapping names"


def labeller(program: str | None = None) -> Any:
    """The zoo's labeller for `CpuCapture.rows`, for one program."""
    return Mapping.load(program).label
