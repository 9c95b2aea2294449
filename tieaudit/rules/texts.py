"""Every rule's public text, defined once (``RULE_TEXTS``): the rule modules build their ``Rule`` from
these records, and ``tieaudit rule``, ``check --help``, SARIF's ``driver.rules`` and docs/rules.md
(``scripts/gen_rules_doc.py``) are rendered from them.

Each statement is about what the rule's module does; each example's output is what tieaudit prints
in that situation (tests/test_rule_examples.py runs every one). Imports nothing of the audit.
"""

from __future__ import annotations

from tieaudit.rules.text_record import RuleText

_RETIE_PLAN = "tieaudit retie model.pt model-retied.pt --dry-run"

TIE001 = RuleText(
    id="TIE001",
    kind="untied-copy",
    severity="warning",
    summary="Two or more matrices hold equal values in separate storage.",
    description="One finding per group of tensors stored in separate storages whose bytes are equal, "
    "the transpose of each other, or a lower-precision cast of each other (relation equal, transposed "
    "or cast). Names that view one storage are views of one buffer, never copies. Equality is byte "
    "equality with no tolerance, and constant tensors and tensors under --min-size (default 1024 "
    "bytes) are never candidates; wasted_bytes is what a rewrite saves, counted by storage. A "
    "warning, or a note when the model class ties none of the names (equal by construction), when "
    "every copy is a slice of a storage other tensors keep, when a PEFT adapter made with "
    "ensure_weight_tying stores the pair on purpose, or for a GGUF head and embedding quantized to "
    "different types (relation quantized).",
    example="model.pt, written by torch.save, stores head.weight as a clone of emb.weight.",
    example_command="tieaudit check model.pt",
    example_output=(
        "  TIE001 warning  untied-copy (equal), 32.0 KiB wasted\n"
        "    names: emb.weight, head.weight\n"
        "    head.weight holds the same bytes as emb.weight in separate storage (32.0 KiB\n"
        "    wasted): values that are equal are not a tie; each copy trains and loads as\n"
        "    its own parameter.\n"
        "    fix: tieaudit retie model.pt model-retied.pt"
    ),
    fix="Re-tie the copies with the command on the finding's fix line: retie writes one tensor for the "
    "group and checks every name against the input bit for bit before its output takes its place. "
    "The fix line adds --relations where the format needs it and --all-equal where the format's "
    "loader would not restore the dropped name (for GGUF and TorchScript, which tieaudit does not "
    "write, it says what to do instead); --dry-run prints the plan and writes nothing. If the copies "
    "are meant to be separate parameters, silence the rule for them.",
    fix_commands=(_RETIE_PLAN, "tieaudit retie model.pt model-retied.pt"),
    ignore_note="Ignored findings count nothing towards max-wasted-bytes (TIE009): to let small copies "
    "pass while capping the total, lower TIE001 to note rather than ignoring it.",
)
TIE002 = RuleText(
    id="TIE002",
    kind="declared-tie-broken",
    severity="error",
    summary="A tie is declared, both names are stored, and their values differ.",
    description="A tie is declared (by config.json through the model class's tie table, by a "
    "safetensors file's __metadata__, by a shard index, or by the policy's [[expect-tie]]), both of "
    "its names are stored in separate storage, and they differ in shape, dtype or values; the "
    "message gives the largest absolute difference and the share of elements that differ. A "
    "declared pair stored as equal copies is no TIE002: it is reported as TIE001. Loaders disagree "
    "on such a file: for a tie declared by config.json, transformers 4.57 silently re-ties the pair "
    "and discards the stored target, while 5.x keeps both untied.",
    example="A Llama folder whose config.json ties the head to the embedding (tie_word_embeddings) "
    "stores both, and the head has drifted from the embedding.",
    example_command="tieaudit check llama",
    example_output=(
        "  TIE002 error  declared-tie-broken\n"
        "    names: lm_head.weight, model.embed_tokens.weight\n"
        "    config.json (tie_word_embeddings, table) ties lm_head.weight to\n"
        "    model.embed_tokens.weight, but both are stored and their values differ (max\n"
        "    abs difference 7.83e-05, 100.0% of elements). transformers 4.57 silently\n"
        "    re-ties and discards the stored lm_head.weight; 5.x keeps both untied.\n"
        "    advice: decide which matrix is right: untie in the config, or store only\n"
        "      model.embed_tokens.weight"
    ),
    fix="Decide which matrix is right. If the two are separate parameters, remove the declaration "
    "(tie_word_embeddings: false in config.json, or the record in the metadata, index or policy); if "
    "they are one, store only the tie's source and drop its target.",
)
TIE003 = RuleText(
    id="TIE003",
    kind="declared-tie-orphan",
    severity="error",
    summary="A tie is declared but only its target is stored; loaders disagree on this layout.",
    description="A tie is declared (config, metadata, index or policy) but only its target, the name "
    "a tied file leaves out, is stored, and its source is missing. Loaders disagree on this layout: "
    "transformers 4.57 leaves both on the meta device, 5.x swaps source and target. In a GGUF file it "
    "fires when output.weight is not stored and llama.cpp's loader for the file's architecture "
    "requires it (an error: the file does not load), and as a note when tieaudit's table of "
    "llama.cpp's loaders cannot say whether the loader falls back to token_embd.weight.",
    example="A Llama folder whose config.json ties the head to the embedding stores lm_head.weight "
    "and no model.embed_tokens.weight.",
    example_command="tieaudit check llama",
    example_output=(
        "  TIE003 error  declared-tie-orphan\n"
        "    names: lm_head.weight, model.embed_tokens.weight\n"
        "    config.json (tie_word_embeddings, table) ties lm_head.weight to\n"
        "    model.embed_tokens.weight, but only lm_head.weight is stored. Loaders\n"
        "    disagree on this layout: transformers 4.57 leaves both on the meta device,\n"
        "    5.x swaps source and target.\n"
        "    advice: store the matrix under model.embed_tokens.weight (and drop\n"
        "      lm_head.weight)"
    ),
    fix="Store the matrix under the tie's source name and drop the target, as the advice line says: "
    "every loader restores the target from the source. For a GGUF file, convert the model again "
    "with output.weight stored, or load it with a llama.cpp whose loader for that architecture "
    "falls back to token_embd.weight.",
)
TIE004 = RuleText(
    id="TIE004",
    kind="vocab-misaligned",
    severity="error",
    summary="Embedding rows, output rows, output bias and declared vocabulary size disagree.",
    description="The input embedding's rows, the output projection's rows, the output bias's length "
    "and the declared vocab_size disagree, or the tokenizer has more tokens than the embedding has "
    "rows (ids past the last row index out of range; fewer tokens, padding rows, is normal). The "
    "tensors compared are the ones the model class uses, from the tie table; without a known class, "
    "a declared tie's names or a few whole names (lm_head.weight, embed_out.weight, top-level "
    "output.weight, model.embed_tokens.weight, ...), never a block's *.output.weight. A head stored "
    "transposed relative to the embedding is measured along its other axis.",
    example="A folder's config.json says vocab_size 288, and model.embed_tokens.weight has 256 rows.",
    example_command="tieaudit check llama",
    example_output=(
        "  TIE004 error  vocab-misaligned\n"
        "    names: model.embed_tokens.weight\n"
        "    vocabulary sizes disagree: embedding rows (model.embed_tokens.weight) = 256,\n"
        "    config vocab_size (config.json) = 288."
    ),
    fix="Make the sizes agree: resize the embedding and the head together (transformers' "
    "resize_token_embeddings also updates vocab_size) and save the model again, or correct vocab_size "
    "in config.json. tieaudit inspect lists every tensor with its shape.",
    fix_commands=("tieaudit inspect llama",),
)
TIE005 = RuleText(
    id="TIE005",
    kind="runtime-duplicate",
    severity="warning",
    summary="ONNX Runtime materialises another copy of a shared initializer.",
    description="Checked for ONNX models only by check --runtime (and measured by tieaudit runtime), "
    "which needs the runtime extra (onnxruntime): ONNX Runtime's optimizer runs in a child process "
    "with the default session options, and tieaudit reads the optimized model it saves. It fires "
    "when ONNX Runtime holds another copy of an initializer in memory: constant folding turns "
    "Transpose(E) into a new initializer while the graph still reads E, or prepacking keeps a packed "
    "copy of a MatMul weight beside the original its other readers use. The file stores the weight "
    "once, so these bytes are memory, not counted in the file's wasted bytes.",
    example="model.onnx stores a tied embedding E once; the head reads it through a Transpose.",
    example_command="tieaudit check model.onnx --runtime",
    example_output=(
        "  TIE005 warning  runtime-duplicate (transposed), 32.0 KiB wasted\n"
        "    names: E, proj_t\n"
        "    ONNX Runtime (default session options) constant-folds proj_t into a new\n"
        "    initializer, a transposed copy of E (32.0 KiB), while the graph still reads\n"
        "    E.\n"
        "    advice: create the session with\n"
        '      options.add_session_config_entry("optimization.disable_specified_optimizers",\n'
        '      "ConstantFolding");\n'
        '      options.add_session_config_entry("session.disable_prepacking", "1")\n'
        "      (tieaudit runtime model.onnx measures the cost)"
    ),
    fix="Create the ONNX Runtime session with the options the advice line names. tieaudit runtime "
    "measures memory and latency under several session configurations, recommends the one that "
    "keeps one copy at the lowest latency and prints the SessionOptions lines for it.",
    fix_commands=("tieaudit runtime model.onnx",),
    ignore_note="Ignoring TIE005 also skips running ONNX Runtime under check --runtime.",
)
TIE006 = RuleText(
    id="TIE006",
    kind="overlapping-views",
    severity="warning",
    summary="Names share a storage with partially overlapping, non-identical views.",
    description="Two or more names view one storage through windows that partially overlap without "
    "being the same view or its transpose, such as two row slices of one tensor sharing some rows. "
    "Writing through one name silently changes part of the other. Names viewing one storage "
    "identically (a tie) or transposed, or through windows that do not overlap, are no finding.",
    example="views.pt was saved with rows_lo = w[:192] and rows_hi = w[64:], two slices of one tensor w "
    "of 256 rows.",
    example_command="tieaudit check views.pt",
    example_output=(
        "  TIE006 warning  overlapping-views\n"
        "    names: rows_lo, rows_hi\n"
        "    rows_lo, rows_hi share storage 0 with partially overlapping views: writing\n"
        "    one silently changes part of the other."
    ),
    fix="If the names are meant to be independent, save each as its own tensor (.clone() before "
    "torch.save); if they are views of one tensor on purpose, save the whole tensor once and take the "
    "slices after loading.",
)
TIE007 = RuleText(
    id="TIE007",
    kind="optimizer-state-split",
    severity="error",
    summary="A training checkpoint's optimizer state does not match the model's ties.",
    description="A training checkpoint's optimizer state is matched to the model's parameters: by "
    "param_names or names when the file has them, else by state_dict order in a torch file, else by "
    "shapes no other parameter has; a match the file cannot settle is reported as such, never "
    "guessed. An error when one tied parameter has two entries, when the optimizer lists more "
    "parameters than the model has, or when a state's shape is not its parameter's "
    "(optimizer.load_state_dict or the first step fails). A warning when each copy of a TIE001 group, "
    "or each side of a declared tie stored apart, has its own state: resumed training updates them "
    "apart.",
    example="train.pt holds a model whose head was tied to its embedding after training, and the "
    "optimizer state of the untied model, with an entry for each.",
    example_command="tieaudit check train.pt",
    example_output=(
        "  TIE007 error  optimizer-state-split, 64.0 KiB wasted\n"
        "    names: model.emb.weight, model.head.weight, optimizer.state.0.step,\n"
        "      optimizer.state.0.exp_avg, optimizer.state.0.exp_avg_sq,\n"
        "      optimizer.state.3.step, optimizer.state.3.exp_avg,\n"
        "      optimizer.state.3.exp_avg_sq\n"
        "    model.emb.weight and model.head.weight are one parameter (they share one\n"
        "    storage), but optimizer has 2 entries for them (parameter keys 0, 3; 2 of\n"
        "    them hold state): load_state_dict into the tied model fails (a group has\n"
        "    fewer parameters than the state lists).\n"
        "    advice: keep one state for the tied parameter and renumber param_groups\n"
        "      (retie of the untied checkpoint does both)"
    ),
    fix="Keep one optimizer state per parameter. retie of a torch training checkpoint with copies "
    "keeps one state for each tied pair and renumbers param_groups, so load_state_dict into the tied "
    "model works (--keep NAME chooses whose state is kept); for a model tied by hand with the "
    "optimizer of its untied past, re-tie the untied checkpoint instead.",
    fix_commands=("tieaudit retie train.pt train-retied.pt",),
)
TIE008 = RuleText(
    id="TIE008",
    kind="expected-tie-missing",
    severity="error",
    summary="The policy requires a tie that the checkpoint does not have.",
    description="The policy's [[expect-tie]] (at the top level, or in a [[path]] entry whose glob "
    "matches the checkpoint) requires a target tied to a source, and the checkpoint stores the two in "
    "separate storage, lacks the source, or lacks the target without anything in its files declaring "
    "it tied. "
    "A tie counts when both names view one storage, or when the files declare it and store only the "
    "source (the loader restores the target).",
    example='tieaudit.toml holds [[expect-tie]] target = "head.weight", source = "emb.weight", and '
    "model.pt stores head.weight as a clone of emb.weight.",
    example_command="tieaudit check model.pt --policy tieaudit.toml",
    example_output=(
        "  TIE008 error  expected-tie-missing\n"
        "    names: head.weight, emb.weight\n"
        "    the policy (tieaudit.toml) requires head.weight tied to emb.weight, but both\n"
        "    are stored in separate storage.\n"
        "    fix: tieaudit retie model.pt OUT"
    ),
    fix="When both are stored as copies, re-tie them (the fix line's command, OUT being the file to "
    "write). Otherwise save the checkpoint from the tied model, or correct the policy's expect-tie "
    "entry if the model is not meant to tie them.",
    fix_commands=("tieaudit retie model.pt model-retied.pt",),
)
TIE009 = RuleText(
    id="TIE009",
    kind="wasted-bytes-cap",
    severity="error",
    summary="The bytes a checkpoint wastes on copies exceed the policy's max-wasted-bytes.",
    description="Checked only when the policy sets max-wasted-bytes: fires when the wasted_bytes of a "
    "checkpoint's findings add up to more. The sum leaves out the findings of ignored rules, TIE005's "
    "(memory ONNX Runtime adds, not bytes of the file) and TIE012's (made later, across files). The "
    "finding names every tensor of the findings that waste bytes.",
    example='tieaudit.toml sets max-wasted-bytes = "16KiB", and model.pt wastes 32 KiB on a copy.',
    example_command="tieaudit check model.pt --policy tieaudit.toml",
    example_output=(
        "  TIE009 error  wasted-bytes-cap\n"
        "    names: emb.weight, head.weight\n"
        "    copies waste 32.0 KiB (32768 bytes), more than the policy's max-wasted-bytes\n"
        "    of 16.0 KiB (16384 bytes).\n"
        "    advice: re-tie the copies (tieaudit retie model.pt OUT) or raise\n"
        "      max-wasted-bytes"
    ),
    fix="Re-tie the copies that waste the bytes (the commands on the other findings' fix lines), or "
    "raise max-wasted-bytes.",
    fix_commands=("tieaudit retie model.pt model-retied.pt",),
    ignore_note="Leaving max-wasted-bytes out of the policy turns the check off as well.",
)
TIE010 = RuleText(
    id="TIE010",
    kind="pickle-runs-code",
    severity="error",
    summary="A pickle needs torch.load(weights_only=False), which would import and call what it names.",
    description="One finding per file whose pickle names a global outside torch's default "
    "weights_only allowlist (exact dotted names, generated from torch and committed; an attribute "
    "chain is a whole name, never a prefix). torch.load(weights_only=True) refuses exactly these "
    "files, and torch.load(weights_only=False) would import each such global and do with it what "
    "the pickle asks; the message lists each one with what loading does (imported, called, "
    "instantiated, state set). tieaudit reads the pickle with inert placeholders and calls nothing.",
    example='checkpoint.pt was saved with the run\'s argparse.Namespace beside the model ("args").',
    example_command="tieaudit check checkpoint.pt",
    example_output=(
        "  TIE010 error  pickle-runs-code\n"
        "    names: argparse.Namespace\n"
        "    checkpoint.pt needs torch.load(weights_only=False), which would import and\n"
        "    use globals outside torch's weights_only allowlist: argparse.Namespace\n"
        "    (imported, instantiated, state set). torch.load(weights_only=True) refuses\n"
        "    the file; tieaudit read it with inert placeholders and called nothing.\n"
        "    advice: do not load this file with weights_only=False; rebuild it from a\n"
        "      trusted source (or keep only its tensors, e.g. as safetensors)"
    ),
    fix="Do not load the file with weights_only=False unless you trust where it came from. Rebuild it "
    "from a trusted source, or save only its tensors (a state dict, or safetensors, which holds no "
    "code).",
    ignore_note="If you trust the globals, list their exact names in the policy's safe-globals (the "
    "names you would pass to torch.serialization.add_safe_globals): they are then a TIE011 note.",
)
TIE011 = RuleText(
    id="TIE011",
    kind="pickle-unknown-global",
    severity="note",
    summary="A pickle names a global outside torch's allowlist that the policy's safe-globals vouches for.",
    description="Never emitted without safe-globals in the policy. One finding per file whose pickle "
    "names globals outside torch's default weights_only allowlist that safe-globals lists (exact "
    "names, never prefixes); globals it does not list are still TIE010. torch.load(weights_only=True) "
    "refuses such a file unless torch.serialization.add_safe_globals names the globals (and the "
    "types their calls return); you vouched for them, so it is a note.",
    example="checkpoint.pt holds the run's argparse.Namespace, and tieaudit.toml says safe-globals = "
    '["argparse.Namespace"].',
    example_command="tieaudit check checkpoint.pt --policy tieaudit.toml",
    example_output=(
        "  TIE011 note  pickle-unknown-global\n"
        "    names: argparse.Namespace\n"
        "    checkpoint.pt names globals outside torch's default weights_only allowlist\n"
        "    that the policy's safe-globals vouches for: argparse.Namespace (imported,\n"
        "    instantiated, state set). torch.load(weights_only=True) refuses it unless\n"
        "    torch.serialization.add_safe_globals names them (and the types their calls\n"
        "    return).\n"
        "    advice: load it inside torch.serialization.safe_globals([...]) naming\n"
        "      exactly these globals"
    ),
    fix="Load the file inside torch.serialization.safe_globals([...]) naming exactly these globals. "
    "Taking a name out of safe-globals makes the file a TIE010 error again.",
)
TIE012 = RuleText(
    id="TIE012",
    kind="cross-file-copy",
    severity="note",
    summary="Another file of the same repository holds the same tensors again, byte for byte.",
    description="Made by check across the checkpoints it finds under one folder argument: a later "
    "file holds tensors byte for byte equal to an earlier file's, as one model in two formats "
    "(model.safetensors beside pytorch_model.bin, an ONNX export) or decoders that each carry the "
    "weights do. Tensors are compared by value, not by name; constants and tensors under --min-size "
    "are never copies. One note on the later file names both files; its wasted_bytes count in the "
    "run's total. Each file still loads as the model it is.",
    example="A repository folder holds model.pt and model.safetensors, converted from it by tieaudit "
    "convert model.pt model.safetensors.",
    example_command="tieaudit check repo",
    example_output=(
        "  TIE012 note  cross-file-copy (equal), 64.0 KiB wasted\n"
        "    names: emb.weight, head.weight\n"
        "    2 tensors (64.0 KiB) of repo/model.safetensors are byte for byte in\n"
        "    repo/model.pt too (emb.weight, head.weight): most of the file is the same\n"
        "    weights again (if the two are one model in two formats, publishing one saves\n"
        "    the bytes)."
    ),
    fix="If the files are one model in two formats, publish one of them; where several files are "
    "loaded together (decoders), let them share the weights.",
)
TIE013 = RuleText(
    id="TIE013",
    kind="adapter-unties",
    severity="warning",
    summary="A PEFT adapter saves its own copy of a module the base model ties, so loading it unties them.",
    description="A PEFT adapter (adapter_model.safetensors beside adapter_config.json) lists in "
    "modules_to_save a module its base model ties, one side of the tie or both, without "
    "ensure_weight_tying: PEFT loads the saved copy in place of the base model's module and the tie "
    "is broken. The base class is auto_mapping.base_model_class, or the architectures of the base "
    "model's config.json found locally (never downloaded); its ties come from tieaudit's tie table. "
    "A warning when the base config ties them or, unread, the class ties by default; nothing when "
    "the base config unties them; a note when the class ties only if its config says so, or when no "
    "base class is found.",
    example='adapter/ was saved by PEFT from a GPT-2 model with modules_to_save=["lm_head"].',
    example_command="tieaudit check adapter",
    example_output=(
        "  TIE013 warning  adapter-unties\n"
        "    names: base_model.model.lm_head.weight\n"
        "    the adapter's modules_to_save saves its own lm_head but not transformer.wte:\n"
        "    on a base GPT2LMHeadModel (which its class ties by default: lm_head.weight =\n"
        "    transformer.wte.weight), PEFT loads them as two separate matrices and the\n"
        "    tie is broken (adapter_config.json: ensure_weight_tying is not true).\n"
        "    advice: make the adapter with ensure_weight_tying=True (PEFT keeps the tied\n"
        "      modules one), or leave the tied modules out of modules_to_save, and save\n"
        "      it again"
    ),
    fix="Make the adapter again with ensure_weight_tying=True in its LoraConfig (PEFT then keeps the "
    "tied modules one), or leave the tied modules out of modules_to_save.",
)

RULE_TEXTS: dict[str, RuleText] = {
    text.id: text
    for text in (TIE001, TIE002, TIE003, TIE004, TIE005, TIE006, TIE007)
    + (TIE008, TIE009, TIE010, TIE011, TIE012, TIE013)
}
"""Every rule's record by id, in id order (the registry holds a rule for each, and no other)."""


def rule_text(name: str) -> RuleText | None:
    """The record of the rule name names, in any letter case ('tie004' -> TIE004), or None."""
    return RULE_TEXTS.get(name.strip().upper())
