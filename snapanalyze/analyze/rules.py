"""Attribution rules as data: categories, frame rules and plumbing patterns, loaded from TOML.

Contract: `shipped_rules()` returns the RuleSet built from `categories.toml` and the
shipped rule packs (every `rulepacks/*.toml`, in the `order` its `[pack]` table declares; a pack's `scope`
names a file pattern of `scopes.toml` that its [[rules]] must also match) and the call-tree roles (`roles.toml`, see
`calltree`); `rules_from_toml(text, where)` the same with a user's TOML file (its text, and the name its
errors give; `session.load_rules` reads it) layered on top: its `[[categories]]` are added (or redefine a shipped
one's precedence/owner), its `[[rules]]` are consulted before the shipped ones, its `[[plumbing]]` and
`[[passthrough]]` are added, and `disable = [names]` switches shipped rules, roles, backward-node rules,
heuristics (`HEURISTICS`) and whole stages of attribution (`STAGES`) off.
A rule matches a frame when every pattern it gives matches (Python regexes, `re.search`): `file` (paths with
'/' separators) and `function` on the frame itself;
`qualname` (``Class.method``), `class` (the enclosing class or any of its bases), `code` (the statement at
the line) and `call` (the only call that statement makes) on what the program's source says about the frame
(`frame_source`), so a rule giving any of those four matches only frames whose source was found. `where =
"allocating"` limits a rule to the allocating line (the innermost meaningful Python frame), `where = "inside"` to
a line whose call allocated (a frame that is not the allocating line); `weak = true`
makes a rule a guess from a name that the call tree's role overrules (and that is flagged inferred);
`caller` (a regex over the Python frame that called it, as "file:function") limits a rule to frames that
frame calls (the method torch.optim's step wrapper calls is an optimizer's own step, whatever its file);
`confirm = true` makes a rule a hint that counts only when another frame of the same stack proves the same category (an
activation function is MLP only inside an MLP). `[[plumbing]]` frames never decide and are hidden; their
`tags` mark the stack's context (``autograd``, ``autocast``, ``optimizer``). `[[passthrough]]` frames (a
Linear, a norm, torch itself) decide nothing of their own: the module that called them does. A malformed
file raises RulesError naming the file and the problem. `[[modules]]` rules match module spans (the
collector's `module` markers) by `path` (searched in the qualified module path, ``model.layers.3.mlp``) and
`class`. `with_source` binds the rules to a snapshot's `FrameSources` (the attribution does, with the
snapshot's own); matches are cached per distinct frame.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from .. import tomldata
from ..errors import RulesError
from ..frame_source import FrameSource, FrameSources
from .calltree import RoleData, parse_roles

# The stages of attribution, by name, in the order they run (`analyze.attribute`: `frames.FRAME_STAGES`, then
# `label.STAGES`); a rules file's `disable` accepts each name and attribution runs without that stage.
STAGES = {
    "stage.source": "frames read their source (class, qualified name, code at the line) where it fits the run",
    "stage.rules": "every frame rule (shipped and the file's own) matches the frames of each stack",
    "stage.calltree": "where no rule decides: a backward's autograd node, else the role of the model code in the "
                      "trace's call tree",
    "stage.before_window": "frame-less blocks from before the window: persistent state, state an optimizer step "
                           "replaced, else unknown",
    "stage.module_spans": "a collector's module span around the allocation names the module",
    "stage.signals": "block-level evidence: private pools, .grad lifetimes, other requests, size relations",
    "stage.annotations": "an annotation the program made on a block naming a category decides it",
}
# The heuristics of attribution, by name, in the order they apply after the rules and the call tree's roles
# (module docstring of `attribute`); a rules file's `disable` list accepts each name. Every one is flagged
# inferred wherever it decides.
HEURISTICS = {
    "calltree.callees": "a function whose callees have one role takes it over its file's name",
    "order.apply_grad": "Module._apply's copy right after a parameter's, of its size, is that parameter's .grad",
    "state.retained_activation": "a frame-less block from before the window with the size of activations the "
                                 "window shows the program keeping is one of them",
    "state.replaced_optimizer_state": "a frame-less block from before the window with the size of state the window "
                                      "shows an optimizer keeping and replacing (LBFGS's history) is more of it",
    "state.copies": "frame-less persistent sizes repeating k times in a training program are parameters and "
                    "k − 1 copies of state",
    "state.layers": "frame-less persistent sizes repeating as a model's layers do are its parameters and buffers",
    "state.gradient_sizes": "a frame-less persistent block of the size of a gradient the window's backward makes is "
                            "a parameter",
    "state.cublas_workspace": "a frame-less persistent block of PyTorch's default cuBLAS workspace size",
    "state.freed_by_zero_grad": "a frame-less block from before the window that zero_grad frees is a .grad",
    "state.freed_by_module_move": "a frame-less block from before the window that Module._apply frees (the module "
                                  "moved off the device) is a parameter or buffer",
    "lifetime.survived_backward": "made by the autograd engine's device thread and live after its backward, with a "
                                  "live parameter's size: a .grad",
    "shape.autocast_weight_copy": "an autocast cast half the size of a live weight is its 16-bit copy",
    "shape.tokens_x_vocab": "tokens × a live vocabulary × 2 or 4 bytes is logits",
    "shape.gate_up_of_mlp": "twice a live MLP output, made right before it, is the fused gate/up projection",
    "shape.cublas_workspace": "a never-freed block of the default cuBLAS workspace size",
    "shape.attention_scores": "B·H·L² × 2 or 4 bytes under user attention code is materialised scores",
    "shape.backward_pairing": "a backward's temporary with the size of live activations of one category is the "
                              "gradient of one of them",
}
# What a block is across steps, coarser than its category: the `lifecycle` column of attribute's blocks.
LIFECYCLES = ("weights", "gradients", "optimizer_state", "inputs", "kv_cache", "logits", "workspace",
              "graph_capture", "activations", "unknown")
_PACKAGE = "snapanalyze.analyze"   # where categories.toml, scopes.toml, roles.toml and rulepacks/ ship
OWNERS = ("outermost", "innermost")
SOURCE_KEYS = ("qualname", "class", "code", "call")
Frame = tuple[str, int, str]


@dataclass(frozen=True)
class Category:
    name: str
    precedence: int
    owner: str
    description: str = ""
    # Context tags across which a match of this category does not own an allocation: a frame of the category
    # owns only what its own code allocates, not what a call it makes runs (an optimizer step that runs the
    # model through a closure). "model_code" stands for a frame of the program's or a model library's code in
    # another file that matches no rule of this category.
    not_across: tuple[str, ...] = ()
    context_tag: str = ""             # the context tag that marks a stack as inside this category's scope
    color: str = ""                   # what plots draw it in ("" : a spare colour)
    # Made by a forward pass and dead once its backward ran (or, without autograd, once the forward ended): a
    # block of it that outlives a training step and whose code has run again since was kept (analyze/kept.py).
    per_forward: bool = False
    # State that lives across steps (weights, the KV pool, graph pools, gradients, optimizer state): the rest of
    # a peak rises on top of it, and a frame's decision in it is never overridden by a block-level heuristic.
    persistent: bool = False
    # What the category's blocks are across steps (LIFECYCLES); "" for `other` and categories that do not say:
    # such a block is an activation where it was made and freed inside the window, else unknown.
    lifecycle: str = ""


@dataclass(frozen=True)
class Rule:
    """One named pattern over a single frame, with the category it proves and why."""

    name: str
    category: str
    reason: str
    file: re.Pattern[str] | None
    function: re.Pattern[str] | None
    tags: tuple[str, ...] = ()
    pack: str = ""
    qualname: re.Pattern[str] | None = None
    cls: re.Pattern[str] | None = None
    code: re.Pattern[str] | None = None
    call: re.Pattern[str] | None = None
    allocating: bool = False          # where = "allocating": only on the allocating line
    inside: bool = False              # where = "inside": only where a call the line makes allocated
    confirm: bool = False             # a hint another frame of the stack must confirm
    weak: bool = False                # a guess from a file name, which the call tree's evidence overrides
    caller: re.Pattern[str] | None = None   # over the calling Python frame, "file:function" (None: any)
    scope: re.Pattern[str] | None = None    # its pack's scope (`scopes.toml`): a file pattern that must match too

    def called_by(self, frame: Frame | None) -> bool:
        """Whether the rule's `caller` pattern (if any) accepts the frame that called the matched one."""
        return self.caller is None or (frame is not None and self.caller.search(f"{frame[0]}:{frame[2]}")
                                       is not None)

    @property
    def needs_source(self) -> bool:
        return any(p is not None for p in (self.qualname, self.cls, self.code, self.call))

    def matches(self, filename: str, function: str, source: FrameSource | None = None) -> bool:
        if not ((self.file is None or self.file.search(filename) is not None)
                and (self.function is None or self.function.search(function) is not None)
                and (self.scope is None or self.scope.search(filename) is not None)):
            return False
        if not self.needs_source:
            return True
        if source is None:
            return False
        return ((self.qualname is None or self.qualname.search(source.qualname) is not None)
                and (self.cls is None or any(self.cls.search(c) is not None for c in (source.cls, *source.bases)
                                             if c))
                and (self.code is None or self.code.search(source.code) is not None)
                and (self.call is None or self.call.search(source.call) is not None))


@dataclass(frozen=True)
class FrameFacts:
    """What the rules say about one frame: hidden plumbing (with the context tags it marks), a pass-through
    layer, the rules that match it (indices, in order) and what its source says (None: not found)."""

    plumbing: bool
    context: tuple[str, ...]
    passthrough: bool
    matched: tuple[int, ...]
    source: FrameSource | None


@dataclass(frozen=True)
class ModuleRule:
    """A pattern over a module span (a `collect.modules` marker): its qualified path and its class."""

    name: str
    category: str
    reason: str
    path: re.Pattern[str] | None
    cls: re.Pattern[str] | None
    tags: tuple[str, ...] = ()
    pack: str = ""

    def match(self, path: str, classes: str) -> int | None:
        """How deep in the module chain the rule matches (the component index where its last match ends;
        `path` is the qualified path ``model.layers.3.mlp``, `classes` the class of each of its modules
        joined the same way), or None. Every pattern given must match; the deepest position counts."""
        depth = -1
        for pattern, text in ((self.path, path), (self.cls, classes)):
            if pattern is None:
                continue
            ends = [m.end() for m in pattern.finditer(text)]
            if not ends:
                return None
            depth = max(depth, text.count(".", 0, max(ends[-1] - 1, 0)))
        return depth


@dataclass
class RuleSet:
    categories: dict[str, Category]
    rules: list[Rule]
    plumbing: list[Rule]
    sources: list[str] = field(default_factory=list)
    passthrough: list[Rule] = field(default_factory=list)
    modules: list[ModuleRule] = field(default_factory=list)
    source: FrameSources | None = None         # a snapshot's frames' source (`with_source`)
    role_data: RoleData = field(default_factory=RoleData)
    disabled: frozenset[str] = frozenset()     # names of `HEURISTICS` and `STAGES` a rules file disabled
    _frame_cache: dict[Frame, FrameFacts] = field(default_factory=dict, repr=False)
    _plumbing_cache: dict[tuple[str, str], bool] = field(default_factory=dict, repr=False)
    _passthrough_cache: dict[tuple[str, str], bool] = field(default_factory=dict, repr=False)
    _bound: dict[int, tuple[FrameSources | None, RuleSet]] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def scoped_tags(self) -> dict[str, frozenset[str]]:
        """Context tag of a category's scope (`context_tag`) -> the tags that end that scope (`not_across`)."""
        return {c.context_tag: frozenset(c.not_across) for c in self.categories.values() if c.context_tag}

    @functools.cached_property
    def persistent(self) -> frozenset[str]:
        """The categories of state that lives across steps (`Category.persistent`)."""
        return frozenset(c.name for c in self.categories.values() if c.persistent)

    @functools.cached_property
    def per_forward(self) -> tuple[str, ...]:
        """The categories a forward pass makes (`Category.per_forward`), for `analyze.kept`."""
        return tuple(c.name for c in self.categories.values() if c.per_forward)

    def with_source(self, source: FrameSources | None) -> RuleSet:
        """These rules bound to a snapshot's frame sources: a RuleSet with its own frame cache, made once per
        map."""
        if source is self.source:
            return self
        kept = self._bound.get(id(source))
        if kept is None or kept[0] is not source:
            kept = self._bound[id(source)] = (source, RuleSet(
                categories=self.categories, rules=self.rules, plumbing=self.plumbing, sources=self.sources,
                passthrough=self.passthrough, modules=self.modules, source=source, role_data=self.role_data,
                disabled=self.disabled))
        return kept[1]

    def enabled(self, heuristic: str) -> bool:
        """Whether a named heuristic (`HEURISTICS`) or stage (`STAGES`) may decide: no rules file disabled it."""
        return heuristic not in self.disabled

    def facts(self, frame: Frame) -> FrameFacts:
        """What the rules (and the bound source) say about one frame, cached per distinct frame."""
        hit = self._frame_cache.get(frame)
        if hit is None:
            filename, line, function = frame
            plumbing_rules = [p for p in self.plumbing if p.matches(filename, function)] \
                if self.is_plumbing(filename, function) else []
            source = None
            if not plumbing_rules and self.source is not None and filename.endswith(".py"):
                source = self.source.resolve(filename, line, function)
            if plumbing_rules:
                hit = FrameFacts(True, tuple(dict.fromkeys(t for p in plumbing_rules for t in p.tags)), False, (),
                                 None)
            else:
                hit = FrameFacts(False, (), any(p.matches(filename, function, source) for p in self.passthrough),
                                 tuple(i for i, r in enumerate(self.rules) if r.matches(filename, function, source)),
                                 source)
            self._frame_cache[frame] = hit
        return hit

    def match_frame(self, filename: str, function: str, caller: Frame | None = None) -> tuple[bool, tuple[int, ...]]:
        """(is plumbing, indices of matching rules in order) for one frame, by its file and function alone,
        called from the Python frame `caller` (a rule with a `caller` pattern matches only where it fits)."""
        facts = (self if self.source is None else self.with_source(None)).facts((filename, 0, function))
        return facts.plumbing, tuple(i for i in facts.matched if self.rules[i].called_by(caller))

    def is_passthrough(self, filename: str, function: str) -> bool:
        """Whether a frame is a pass-through layer by its file and function alone (no source)."""
        return _any_match(self._passthrough_cache, self.passthrough, filename, function)

    def is_plumbing(self, filename: str, function: str) -> bool:
        return _any_match(self._plumbing_cache, self.plumbing, filename, function)


def _any_match(cache: dict[tuple[str, str], bool], rules: list[Rule], filename: str, function: str) -> bool:
    """Whether any of `rules` matches a frame by its file and function, cached per (file, function)."""
    hit = cache.get((filename, function))
    if hit is None:
        hit = cache[(filename, function)] = any(r.matches(filename, function) for r in rules)
    return hit


def _compile(pattern: Any, where: str, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise RulesError(f"{where}: '{what}' must be a string regex, got {type(pattern).__name__}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise RulesError(f"{where}: '{what}' is not a valid regex ({exc})") from None


def _rule(item: Any, where: str, pack: str, categories: dict[str, Category], kind: str,
          scope: re.Pattern[str] | None = None) -> Rule:
    if not isinstance(item, dict):
        raise RulesError(f"{where}: each rule must be a table")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise RulesError(f"{where}: a rule needs a 'name'")
    where = f"{where}: rule '{name}'"
    known = {"name", "category", "reason", "file", "function", "tags", *SOURCE_KEYS, "where", "confirm", "weak",
             "caller"}
    unknown = set(item) - known
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(known)})")
    category = kind if kind != "rules" else item.get("category")
    if kind == "rules" and category not in categories:
        raise RulesError(f"{where}: unknown category {category!r} (known: {', '.join(categories)}; "
                         "declare new ones under [[categories]])")
    if not any(k in item for k in ("file", "function", *SOURCE_KEYS)):
        raise RulesError(f"{where}: give at least one of 'file' or 'function' (or, matched on the program's "
                         f"source, {', '.join(map(repr, SOURCE_KEYS))})")
    if kind == "plumbing" and any(k in item for k in SOURCE_KEYS):
        raise RulesError(f"{where}: plumbing matches on 'file' and 'function' only")
    if item.get("where", "any") not in ("any", "allocating", "inside"):
        raise RulesError(f"{where}: 'where' must be \"any\", \"allocating\" or \"inside\"")
    for flag in ("confirm", "weak"):
        if not isinstance(item.get(flag, False), bool):
            raise RulesError(f"{where}: '{flag}' must be true or false")
    tags = item.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise RulesError(f"{where}: 'tags' must be a list of strings")
    reason = item.get("reason", "")
    if not isinstance(reason, str) or not reason:
        raise RulesError(f"{where}: a rule needs a one-line 'reason'")
    return Rule(name=name, category=str(category), reason=reason,
                file=_compile(item.get("file"), where, "file"),
                function=_compile(item.get("function"), where, "function"), tags=tuple(tags), pack=pack,
                qualname=_compile(item.get("qualname"), where, "qualname"),
                cls=_compile(item.get("class"), where, "class"),
                code=_compile(item.get("code"), where, "code"), call=_compile(item.get("call"), where, "call"),
                allocating=item.get("where") == "allocating", inside=item.get("where") == "inside",
                confirm=bool(item.get("confirm", False)),
                weak=bool(item.get("weak", False)), caller=_compile(item.get("caller"), where, "caller"),
                scope=scope if kind == "rules" else None)


def _module_rule(item: Any, where: str, pack: str, categories: dict[str, Category]) -> ModuleRule:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise RulesError(f"{where}: each [[modules]] rule needs a 'name'")
    where = f"{where}: module rule '{item['name']}'"
    known = {"name", "category", "reason", "path", "class", "tags"}
    unknown = set(item) - known
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(known)})")
    if item.get("category") not in categories:
        raise RulesError(f"{where}: unknown category {item.get('category')!r} (known: {', '.join(categories)})")
    if "path" not in item and "class" not in item:
        raise RulesError(f"{where}: give at least one of 'path' or 'class'")
    reason = item.get("reason", "")
    if not isinstance(reason, str) or not reason:
        raise RulesError(f"{where}: a rule needs a one-line 'reason'")
    tags = item.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise RulesError(f"{where}: 'tags' must be a list of strings")
    return ModuleRule(item["name"], item["category"], reason, _compile(item.get("path"), where, "path"),
                      _compile(item.get("class"), where, "class"), tuple(tags), pack)


def _module_rules_of(doc: dict[str, Any], where: str, pack: str, categories: dict[str, Category]
                     ) -> list[ModuleRule]:
    items = doc.get("modules", [])
    if not isinstance(items, list):
        raise RulesError(f"{where}: 'modules' must be an array of tables ([[modules]])")
    return [_module_rule(item, where, pack, categories) for item in items]


def _categories(doc: dict[str, Any], where: str, into: dict[str, Category], shipped: bool = False) -> None:
    items = doc.get("categories", [])
    if not isinstance(items, list):
        raise RulesError(f"{where}: 'categories' must be an array of tables ([[categories]])")
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RulesError(f"{where}: each [[categories]] entry needs a 'name'")
        name = item["name"]
        unknown = set(item) - {"name", "precedence", "owner", "description", "not_across", "context_tag", "color",
                               "per_forward", "persistent", "lifecycle"}
        if unknown:
            raise RulesError(f"{where}: category '{name}': unknown key(s) {sorted(unknown)} (allowed: name, "
                             "precedence, owner, description, not_across, context_tag, color, per_forward, "
                             "persistent, lifecycle)")
        base = into.get(name)
        precedence = item.get("precedence", base.precedence if base else 50)
        owner = item.get("owner", base.owner if base else "innermost")
        if not isinstance(precedence, int) or owner not in OWNERS:
            raise RulesError(f"{where}: category '{name}': precedence must be an integer and owner one of "
                             f"{OWNERS}")
        not_across = item.get("not_across", list(base.not_across) if base else [])
        context_tag = item.get("context_tag", base.context_tag if base else "")
        if not isinstance(not_across, list) or not all(isinstance(t, str) for t in not_across) \
                or not isinstance(context_tag, str):
            raise RulesError(f"{where}: category '{name}': not_across must be a list of tags and context_tag "
                             "a string")
        if "color" in item and not shipped:
            raise RulesError(f"{where}: category '{name}': color is set by the shipped categories.toml only "
                             "(plots give a category of your own a spare colour)")
        color = item.get("color", base.color if base else "")
        if not isinstance(color, str) or (color and not re.fullmatch(r"#[0-9a-fA-F]{6}", color)):
            raise RulesError(f"{where}: category '{name}': color must be a #rrggbb string")
        per_forward = item.get("per_forward", base.per_forward if base else False)
        persistent = item.get("persistent", base.persistent if base else False)
        for key, value in (("per_forward", per_forward), ("persistent", persistent)):
            if not isinstance(value, bool):
                raise RulesError(f"{where}: category '{name}': {key} must be true or false")
        lifecycle = item.get("lifecycle", base.lifecycle if base else ("activations" if per_forward else ""))
        if lifecycle not in ("", *LIFECYCLES):
            raise RulesError(f"{where}: category '{name}': lifecycle must be one of {', '.join(LIFECYCLES)}")
        into[name] = Category(name, precedence, owner, str(item.get("description", base.description
                                                                     if base else "")),
                              tuple(not_across), context_tag, color, per_forward, persistent, lifecycle)


def _rules_of(doc: dict[str, Any], where: str, pack: str, categories: dict[str, Category],
              key: str, scope: re.Pattern[str] | None = None) -> list[Rule]:
    items = doc.get(key, [])
    if not isinstance(items, list):
        raise RulesError(f"{where}: '{key}' must be an array of tables ([[{key}]])")
    return [_rule(item, where, pack, categories, key, scope) for item in items]


@dataclass(frozen=True)
class Pack:
    """A rule file's `[pack]` table: its name, where it runs among the shipped packs (`order`, lowest first)
    and the scope (`scopes.toml`) its [[rules]] are limited to."""

    name: str
    order: int
    scope: re.Pattern[str] | None


def _scopes(doc: dict[str, Any], where: str) -> dict[str, re.Pattern[str]]:
    items = doc.get("scopes", [])
    if not isinstance(items, list) or set(doc) - {"scopes"}:
        raise RulesError(f"{where}: only [[scopes]] tables are allowed")
    out = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not isinstance(item.get("file"), str) or set(item) - {"name", "description", "file"}:
            raise RulesError(f"{where}: each [[scopes]] entry has a 'name', a 'file' regex and a 'description'")
        pattern = _compile(item["file"], f"{where}: scope '{item['name']}'", "file")
        if pattern is not None:
            out[item["name"]] = pattern
    return out


def _pack(doc: dict[str, Any], where: str, default: str, scopes: dict[str, re.Pattern[str]]) -> Pack:
    """The `[pack]` table of a rule file, checked (a user file may leave it out)."""
    table = doc.get("pack", {})
    if not isinstance(table, dict) or set(table) - {"name", "description", "order", "scope"}:
        raise RulesError(f"{where}: [pack] allows name, description, order and scope")
    name, order, scope = table.get("name", default), table.get("order", 0), table.get("scope")
    if not isinstance(name, str) or not name or not isinstance(order, int) or isinstance(order, bool):
        raise RulesError(f"{where}: [pack] needs a 'name' string and an integer 'order'")
    if scope is not None and scope not in scopes:
        raise RulesError(f"{where}: [pack] scope {scope!r} is not one of {sorted(scopes)} (scopes.toml)")
    return Pack(name, order, scopes[scope] if scope is not None else None)


@functools.cache
def shipped_rules() -> RuleSet:
    """The shipped categories and packs (module docstring), parsed once per process: the same RuleSet each
    time (treat it as read-only), so repeated attributions share their per-stack decisions."""
    return _build_rules(None)


def rules_from_toml(text: str, where: str) -> RuleSet:
    """The shipped rules with a user's TOML file layered on top (module docstring); `where` names the file in
    every RulesError."""
    return _build_rules((text, where))


def _build_rules(user_toml: tuple[str, str] | None) -> RuleSet:
    categories: dict[str, Category] = {}
    _categories(tomldata.read_shipped(_PACKAGE, "categories.toml"), "categories.toml", categories, shipped=True)
    shipped: list[Rule] = []
    plumbing: list[Rule] = []
    passthrough: list[Rule] = []
    module_rules: list[ModuleRule] = []
    sources = []
    scopes = _scopes(tomldata.read_shipped(_PACKAGE, "scopes.toml"), "scopes.toml")
    packs = []
    for where, doc in tomldata.read_shipped_folder(_PACKAGE, "rulepacks"):   # every shipped pack, in its order
        if "order" not in doc.get("pack", {}):
            raise RulesError(f"{where}: a shipped pack declares its [pack] order")
        packs.append((_pack(doc, where, where.removeprefix("rulepacks/")[:-5], scopes), where, doc))
    for pack, where, doc in sorted(packs, key=lambda p: (p[0].order, p[0].name)):
        shipped += _rules_of(doc, where, pack.name, categories, "rules", pack.scope)
        plumbing += _rules_of(doc, where, pack.name, categories, "plumbing")
        passthrough += _rules_of(doc, where, pack.name, categories, "passthrough")
        module_rules += _module_rules_of(doc, where, pack.name, categories)
        sources.append(where)
    role_data = parse_roles(tomldata.read_shipped(_PACKAGE, "roles.toml"), "roles.toml",
                            list(categories), _compile)
    user: list[Rule] = []
    disabled: frozenset[str] = frozenset()
    if user_toml is not None:
        text, where = user_toml
        doc = tomldata.parse(text, where)
        unknown = set(doc) - {"categories", "rules", "plumbing", "passthrough", "modules", "disable", "pack"}
        if unknown:
            raise RulesError(f"{where}: unknown top-level key(s) {sorted(unknown)} "
                             "(allowed: categories, rules, plumbing, passthrough, modules, disable, pack)")
        _categories(doc, where, categories)
        user = _rules_of(doc, where, "user", categories, "rules", _pack(doc, where, "user", scopes).scope)
        plumbing = _rules_of(doc, where, "user", categories, "plumbing") + plumbing
        passthrough = _rules_of(doc, where, "user", categories, "passthrough") + passthrough
        module_rules = _module_rules_of(doc, where, "user", categories) + module_rules
        disable = doc.get("disable", [])
        if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
            raise RulesError(f"{where}: 'disable' must be a list of rule names")
        names = {r.name for r in (*shipped, *plumbing, *passthrough)} | {m.name for m in module_rules} \
            | role_data.names() | set(HEURISTICS) | set(STAGES)
        missing = [d for d in disable if d not in names]
        if missing:
            raise RulesError(f"{where}: 'disable' names unknown rule(s): {', '.join(missing)}")
        shipped = [r for r in shipped if r.name not in disable]
        plumbing = [p for p in plumbing if p.name not in disable]
        passthrough = [p for p in passthrough if p.name not in disable]
        module_rules = [m for m in module_rules if m.name not in disable]
        role_data = role_data.without(set(disable))
        disabled = frozenset(disable) & (set(HEURISTICS) | set(STAGES))
        sources.insert(0, where)
    seen: dict[str, str] = {}
    for r in user + shipped:
        if r.name in seen:
            raise RulesError(f"{r.pack}: rule name '{r.name}' is used twice")
        seen[r.name] = r.pack
    return RuleSet(categories=categories, rules=user + shipped, plumbing=plumbing, sources=sources,
                   passthrough=passthrough, modules=module_rules, role_data=role_data, disabled=disabled)
