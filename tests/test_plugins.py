"""Plugins: a mechanism, positional scheme or kernel that another installed package registers through the entry
point groups ``attnzoo.attention``, ``attnzoo.positions`` and ``attnzoo.kernels`` shows up in the registries and the
CLI, imported only when it is asked for.

The plugin is a real installed distribution: a package and its ``.dist-info`` (METADATA, entry_points.txt) in a
directory on ``sys.path``, which is what ``pip install`` leaves in site-packages.
"""

import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.attention.kernels import KERNELS
from attnzoo.positions import POSITIONS

PLUGIN = textwrap.dedent(
    '''
    """A tiny attnzoo plugin: one mechanism registered by its module, one positional scheme named by class."""
    from attnzoo.attention import ATTENTION
    from attnzoo.attention.kernels import Kernel
    from attnzoo.attention.kernels.sdpa import records_scores, run_sdpa
    from attnzoo.attention.mha import MultiHeadAttention
    from attnzoo.positions import PositionalEncoding


    @ATTENTION.register("plugin_mha")
    class PluginAttention(MultiHeadAttention):
        """MHA under another name."""


    class NoPositions(PositionalEncoding):
        """Nothing beyond the causal mask, registered by the entry point that names this class."""


    # SDPA under another name, registered by the entry point that names this record.
    PLUGIN_SDPA = Kernel(name="plugin-sdpa", display_name="SDPA (plugin)", run=run_sdpa, call_reasons=records_scores)


    def not_a_kernel():
        """An entry point at a function where the record belongs."""


    def reasons_that_raise(cfg):
        raise RuntimeError("the plugin's static reasons broke")


    def run_that_raises(layer, q, k, v, ctx, **inputs):
        raise RuntimeError("the plugin's kernel broke")


    REASONS_RAISE = Kernel(
        name="plugin-reasons-raise", display_name="broken", run=run_sdpa, static_reasons=reasons_that_raise
    )
    RUN_RAISES = Kernel(name="plugin-run-raises", display_name="broken", run=run_that_raises)
    '''
)
ENTRY_POINTS = """\
[attnzoo.attention]
plugin_mha = attnzoo_tiny_plugin

[attnzoo.positions]
plugin_none = attnzoo_tiny_plugin:NoPositions
plugin_broken = attnzoo_tiny_plugin_missing:Nothing
plugin_exits = attnzoo_tiny_plugin_exits
plugin_ctrl_c = attnzoo_tiny_plugin_ctrl_c
alibi = attnzoo_tiny_plugin:NoPositions

[attnzoo.kernels]
plugin-sdpa = attnzoo_tiny_plugin:PLUGIN_SDPA
plugin-function = attnzoo_tiny_plugin:not_a_kernel
plugin-reasons-raise = attnzoo_tiny_plugin:REASONS_RAISE
plugin-run-raises = attnzoo_tiny_plugin:RUN_RAISES
"""


@pytest.fixture
def plugin_dir(tmp_path):
    site = tmp_path / "site"
    (site / "attnzoo_tiny_plugin").mkdir(parents=True)
    (site / "attnzoo_tiny_plugin" / "__init__.py").write_text(PLUGIN)
    (site / "attnzoo_tiny_plugin_exits.py").write_text("import sys\n\nsys.exit(3)\n")
    (site / "attnzoo_tiny_plugin_ctrl_c.py").write_text("raise KeyboardInterrupt\n")
    dist_info = site / "attnzoo_tiny_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnzoo-tiny-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


@pytest.fixture
def installed(plugin_dir, monkeypatch):
    """The plugin on this interpreter's path; the registries are left as they were afterwards."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    importlib.invalidate_caches()
    before = {registry: dict(registry._classes) for registry in (ATTENTION, POSITIONS, KERNELS)}
    yield plugin_dir
    for registry, classes in before.items():
        registry._classes.clear()
        registry._classes.update(classes)
    sys.modules.pop("attnzoo_tiny_plugin", None)


def test_the_installed_distributions_are_scanned_once_per_sys_path(plugin_dir, monkeypatch):
    """Every name asked for scanned every distribution's metadata: 220 scans, 5 of the 9 s that importing
    attnzoo.compare took (its presets parse their variant labels)."""
    scans = []
    entry_points = importlib.metadata.entry_points

    def counted(**selection):
        scans.append(selection["group"])
        return entry_points(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    monkeypatch.setattr(ATTENTION, "_scanned_path", None)  # both restored after, so no later test sees the plugin
    monkeypatch.setattr(ATTENTION, "_entry_points", {})
    for _ in range(3):
        assert "mha" in ATTENTION.names() and "plugin_mha" not in ATTENTION.names()
    assert scans == ["attnzoo.attention"]
    monkeypatch.syspath_prepend(str(plugin_dir))  # a new path is scanned again, and its plugin is listed
    assert "plugin_mha" in ATTENTION.names() and scans == ["attnzoo.attention"] * 2


def test_a_kernel_plugin_is_an_attn_backend(installed):
    """A record named by its entry point: attn_backend names it, the layers run it, and it equals SDPA exactly."""
    assert "plugin-sdpa" in KERNELS.names() and "attnzoo_tiny_plugin" not in sys.modules
    cfg = ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, attn_backend="plugin-sdpa")
    model = Transformer(cfg).eval()
    sdpa = Transformer(ModelConfig.from_dict({**cfg.to_dict(), "attn_backend": "sdpa"})).eval()
    sdpa.load_state_dict(model.state_dict())
    idx = torch.randint(0, 16, (1, 6))
    assert model.attention_kernels(idx) == ["plugin-sdpa"]
    with torch.no_grad():
        assert torch.equal(model(idx), sdpa(idx))


def test_a_kernel_plugin_that_is_not_a_kernel_is_named_with_its_entry_point(installed):
    """It ended in AttributeError: 'function' object has no attribute 'static_refusal'."""
    where = "plugin plugin-function = 'attnzoo_tiny_plugin:not_a_kernel' (entry point group attnzoo.kernels)"
    with pytest.raises(ValueError, match=re.escape(f"{where} is a function, not an attnzoo.attention.kernels.Kernel")):
        ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, attn_backend="plugin-function")


@pytest.mark.parametrize(
    ("backend", "entry_point", "raised"),
    [
        (
            "plugin-reasons-raise",
            "REASONS_RAISE",
            'its static_reasons raised RuntimeError("the plugin\'s static reasons broke")',
        ),
        ("plugin-run-raises", "RUN_RAISES", 'its run raised RuntimeError("the plugin\'s kernel broke")'),
    ],
)
def test_a_kernel_plugin_that_raises_is_named_with_its_entry_point(installed, backend, entry_point, raised):
    """Its error surfaced as a bare traceback from inside attnzoo, naming no plugin."""
    where = (
        f"attention kernel plugin {backend} = 'attnzoo_tiny_plugin:{entry_point}' (entry point group attnzoo.kernels)"
    )
    with pytest.raises(ValueError, match=re.escape(f"{where}: {raised}")):
        model = Transformer(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, attn_backend=backend))
        model(torch.randint(0, 16, (1, 6)))


def test_plugins_are_listed_without_being_imported_and_load_when_asked_for(installed):
    assert "plugin_mha" in ATTENTION.names() and "plugin_none" in POSITIONS.names()
    assert "attnzoo_tiny_plugin" not in sys.modules  # lazily: listing imports nothing
    cfg = ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, attention="plugin_mha", position="plugin_none")
    assert "attnzoo_tiny_plugin" in sys.modules
    assert ATTENTION.get("plugin_mha").__name__ == "PluginAttention"
    assert POSITIONS.get("plugin_none").registry_name == "plugin_none"
    logits = Transformer(cfg)(torch.randint(0, 16, (1, 5)))
    assert logits.shape == (1, 5, 16)


def test_a_broken_plugin_is_a_clear_error_naming_its_entry_point(installed):
    with pytest.raises(ValueError, match=r"plugin plugin_broken = 'attnzoo_tiny_plugin_missing:Nothing'.*failed"):
        ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, position="plugin_broken")


def test_a_plugin_that_exits_on_import_is_an_error_not_a_silent_exit(installed):
    """Its sys.exit(3) ended the command with status 3 and no word."""
    with pytest.raises(ValueError, match=r"plugin_exits = 'attnzoo_tiny_plugin_exits' .*sys.exit\(3\) on import"):
        POSITIONS.get("plugin_exits")


def test_a_plugin_that_raises_keyboard_interrupt_on_import_is_named(installed):
    """The KeyboardInterrupt escaped, and the command said only "attnzoo info: interrupted", naming no plugin."""
    words = r"plugin_ctrl_c = 'attnzoo_tiny_plugin_ctrl_c' \(entry point group attnzoo.positions\) failed to load: "
    with pytest.raises(ValueError, match=words + "KeyboardInterrupt while it was imported"):
        try:
            ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, position="plugin_ctrl_c")
        except KeyboardInterrupt:  # a failure of this test, not a Ctrl-C that ends the whole session
            pytest.fail("the plugin's KeyboardInterrupt escaped, naming no plugin")


def test_a_plugin_named_like_a_built_in_is_named_in_a_warning(installed, monkeypatch, caplog):
    """It was silently never loaded: the built-in alibi won."""
    monkeypatch.setattr(POSITIONS, "_clashes_told", False)
    assert POSITIONS.get("alibi").__name__ != "NoPositions"
    assert POSITIONS.get("rope")  # told once
    (told,) = [r.getMessage() for r in caplog.records if "is built in" in r.getMessage()]
    assert re.search(r"position.* plugin alibi = 'attnzoo_tiny_plugin:NoPositions' .*is not loaded: 'alibi'", told)


def test_without_the_plugin_its_name_is_unknown():
    assert "plugin_mha" not in ATTENTION.names()
    with pytest.raises(ValueError, match="attention='plugin_mha' is not a known attention mechanism"):
        ATTENTION.get("plugin_mha")


def test_the_cli_offers_and_runs_a_plugin_mechanism(plugin_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), *sys.path])}

    def attnzoo(*args):
        done = subprocess.run([sys.executable, "-m", "attnzoo", *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "plugin_mha" in attnzoo("train", "--help") and "plugin_none" in attnzoo("info", "--help")
    out = attnzoo("info", "--attention", "plugin_mha", "--position", "plugin_none", "--dim", "32", "--n-heads", "2")
    assert "plugin_mha" in out and "plugin_none" in out
