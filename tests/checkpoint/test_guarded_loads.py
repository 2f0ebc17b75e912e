"""Every place cadence reads a file, listed with how it is protected: a new ``torch.load(``, ``pickle.load(``,
``json.load(``, ``open(`` for reading, ``read_text``/``read_bytes``, ``load_file``/``safe_open``, or engine loader
anywhere in ``src/cadence`` fails this test until it goes through the guarded helpers (``checkpoint_io/formats.py``:
``safe_load``, ``checked_path``, ``checked_files``; the DeepSpeed and DCP checks) or is added to the table below with
the reason it is safe. The table is the audit of what cadence opens from a checkpoint or a user-given folder.

Found by reading the source's syntax tree (calls, not text), so comments and docstrings do not count.
"""

import ast
import collections
from pathlib import Path
from repo_paths import REPO

SRC = Path(REPO) / "src" / "cadence"

# (module, function, call) -> how it is protected
AUDIT = {
    # --- checkpoint folders: unpickling
    ("checkpoint_io/formats.py", "safe_load", "torch.load"):
        "weights_only=True (numpy's array type only for rng_state); checked_path first (a regular file); TorchScript "
        "archives refused before torch.load (it would hand them to torch.jit.load)",
    ("checkpoint_io/deepspeed_files.py", "check_deepspeed_folder", "torch.load"):
        "weights_only=True with DeepSpeed's four classes, mmap; every file under every tag folder (latest, "
        "latest_universal) through checked_files (regular files inside the checkpoint, links followed and confined)",
    ("checkpoint_io/deepspeed_files.py", "check_deepspeed_folder", "open"):
        "reads 4 bytes of a file checked_files passed (zip magic)",
    ("checkpoint_io/sharded.py", "check_dcp_folder", "torch.load"): "weights_only=True on one blob's bytes",
    ("checkpoint_io/sharded.py", "_safe_dcp_classes.SafePlanner.load_bytes", "torch.load"): "weights_only=True",
    ("checkpoint_io/sharded.py", "read_dcp_metadata", "open"):
        ".metadata through checked_path, unpickled by an Unpickler that knows only DCP's record classes",
    ("checkpoint_io/sharded.py", "check_dcp_folder", "open"):
        "a .distcp file read_dcp_metadata named (a plain file name of the folder) and passed through checked_path",
    ("checkpoint_io/sharded.py", "load_dcp", "dcp.load"): "check_dcp_folder first; its reader loads with weights_only",
    ("backend/deepspeed_engine.py", "DeepSpeedEngine.load_model_weights", "load_checkpoint"):
        "DeepSpeed unpickles with weights_only=False: check_deepspeed_folder first, for any folder with a tag file",
    ("backend/deepspeed_engine.py", "DeepSpeedEngine.load_optimizer_state", "load_checkpoint"): "check_deepspeed_folder first",
    # --- checkpoint folders: weights and JSON
    ("checkpoint_io/formats.py", "read_model_weights", "load_file"):
        "safetensors (no code); each file through checked_path (shards an index names included)",
    ("checkpoint_io/formats.py", "_index_shards", "read_text"): "weights_files found it with is_file(); JSON only",
    ("checkpoint_io/formats.py", "load_training_args", "read_text"):
        "training_args.json through checked_path; JSON only; any damage skipped with a warning",
    ("checkpoint/manifest.py", "_sha256", "open"):
        "a manifest entry through checked_path (and the whole checkpoint-N folder through checked_files) first",
    ("checkpoint/manifest.py", "_read_manifest", "read_text"): "checked_path; JSON only; entries must stay inside",
    ("checkpoint/manifest.py", "_parse_check", "read_text"): "checked_path in verify_checkpoint first; JSON only",
    ("checkpoint/manifest.py", "_check_safetensors", "open"): "checked_path first; reads the header only",
    ("checkpoint/manifest.py", "_read_json_object", "read_text"):
        "checked_path; trainer_state.json / loop_state.json, JSON only, fields type-checked, RecursionError caught",
    ("checkpoint_io/deepspeed_files.py", "tag_folders", "read_text"): "latest / latest_universal through checked_path",
    ("peft_support.py", "load_adapter_weights", "load_file"):
        "safetensors (no code); is_file() first (a FIFO or device is 'missing'); a checkpoint-N folder's files all "
        "pass checked_files in verify_checkpoint before",
    ("trainer_state.py", "TrainerState.load_from_json", "open"):
        "JSON only; resume reaches it through read_trainer_state (checked_path, fields typed); else a path a user passes",
    ("trainer_state.py", "TrainerState.load_from_json", "json.load"): "as above",
    ("output_guard.py", "job_checkpoints", "read_text"): "loop_state.json through checked_path; JSON only",
    ("output_guard.py", "OutputDirLock._read_owner", "read_bytes"): "cadence's own lock file in output_dir; JSON only",
    # --- files a user names (configs), and the process's own files
    ("backend/deepspeed.py", "deepspeed_config", "open"): "the DeepSpeed config path a user passes; JSON only",
    ("backend/deepspeed.py", "deepspeed_config", "json.load"): "as above",
    ("backend/fsdp.py", "_fsdp_config", "open"): "the fsdp_config path a user passes; JSON only",
    ("backend/fsdp.py", "_fsdp_config", "json.load"): "as above",
    ("training_args_types.py", "AcceleratorConfig.from_json_file", "open"):
        "the accelerator_config path a user passes; JSON",
    ("training_args_types.py", "AcceleratorConfig.from_json_file", "json.load"): "as above",
    ("cli_train.py", "_read_config", "read_text"): "the config file a user passes to cadence train; JSON or yaml.safe_load",
    ("cli_env.py", "_cadence_install", "read_text"): "cadence's own installed metadata (direct_url.json); JSON only",
    ("cli_train.py", "training_args_groups", "read_text"): "cadence's own training_args.py source, read for its headings",
    ("script_metrics.py", "save_metrics", "read_text"):
        "all_results.json this run's main process writes, read only as a regular file (checked_path); JSON only",
    ("integrations/jsonl.py", "drop_rows_after", "open"): "the run's own log file; JSON lines only",
    ("integrations/jsonl.py", "read_log_history", "read_bytes"): "the run's own log file; JSON lines only",
    ("integrations/kubeflow.py", "KubeflowCallback._get_token", "open"): "the pod's service-account token file",
    ("integrations/registry.py", "_comet_api_key", "read_text"): "comet's config files, searched for a key name only",
    ("memory_metrics.py", "_proc_status_bytes", "open"): "/proc/self/status",
    ("output_guard.py", "_start_time", "read_text"): "/proc/<pid>/stat",
    ("checkpoint/writer.py", "_fsync_tree", "open"): "files this process just wrote, opened to fsync them",
    ("checkpoint/writer.py", "_fsync_tree", "os.open"): "folders this process just wrote, opened to fsync them",
    ("checkpoint/writer.py", "_fsync_dir", "os.open"): "a folder, opened to fsync it",
}

READERS = {"torch.load", "torch.jit.load", "pickle.load", "pickle.loads", "json.load", "np.load", "numpy.load",
           "dcp.load", "open", "io.open", "os.open"}
METHODS = {"read_text", "read_bytes", "load_file", "safe_open", "load_checkpoint", "load_state_dict_from_url"}


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def _writes(node, kind):
    """An open() for writing (a mode with w/a/x, os.open with O_WRONLY/O_CREAT/O_RDWR): not a read."""
    if kind == "os.open":
        flags = ast.unparse(node)
        return any(flag in flags for flag in ("O_WRONLY", "O_CREAT", "O_RDWR"))
    modes = node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
    return bool(modes) and isinstance(modes[0], ast.Constant) and any(c in str(modes[0].value) for c in "wax")


def reads_in_source():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        scope = []

        class Visitor(ast.NodeVisitor):
            def visit_FunctionDef(self, node):
                scope.append(node.name)
                self.generic_visit(node)
                scope.pop()

            visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

            def visit_Call(self, node):
                name = _dotted(node.func)
                if name:
                    kind = name if name in READERS else name.rsplit(".", 1)[-1]
                    if (kind in READERS or kind in METHODS) and not (kind in ("open", "io.open", "os.open")
                                                                      and _writes(node, kind)):
                        if kind == "open" and name != "open":  # Path.open / a file object's open: counted as open
                            kind = "open"
                        found.append((module, ".".join(scope), kind))
                self.generic_visit(node)

        Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def test_every_file_read_in_cadence_is_in_the_audit():
    found = collections.Counter(reads_in_source())
    new = sorted(set(found) - set(AUDIT))
    assert not new, (
        "new file reads in src/cadence, not in the audit: " + "; ".join(f"{m} {f}: {k}" for m, f, k in new)
        + ". Read checkpoint files through checkpoint_io/formats.py's safe_load / checked_path / checked_files (or the "
        "DeepSpeed and DCP checks), then add the place to AUDIT with how it is protected")
    gone = sorted(set(AUDIT) - set(found))
    assert not gone, f"the audit lists reads that are no longer in the source (update AUDIT): {gone}"


def test_the_scan_sees_a_new_unguarded_load(tmp_path, monkeypatch):
    """The scan itself: a module with a plain torch.load and a read-mode open is reported; writes are not."""
    (tmp_path / "planted.py").write_text(
        "import torch\n\ndef resume(folder):\n    open(folder + '/log', 'w').write('x')\n"
        "    with open(folder + '/x.json') as f:\n        pass\n    return torch.load(folder + '/optimizer.pt')\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert sorted(reads_in_source()) == [("planted.py", "resume", "open"), ("planted.py", "resume", "torch.load")]
