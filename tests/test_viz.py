import torch
from PIL import Image

from attnzoo import ModelConfig, Transformer
from attnzoo.viz import plot_attention_maps


def test_one_png_per_layer_for_signed_and_plain_maps(tmp_path):
    idx = torch.randint(0, 32, (1, 12))
    for attention, options in (("mha", {}), ("diff", {"lambda_init": 0.9})):
        cfg = ModelConfig(
            vocab_size=32, dim=32, n_layers=2, n_heads=4, attention=attention, attention_options=options, init_std=0.5
        )
        model = Transformer(cfg)
        maps = model.attention_maps(idx)
        if attention == "diff":
            assert (maps[0] < 0).any()  # the differential map is signed: the plot must cope
        paths = plot_attention_maps(maps, [str(i) for i in idx[0].tolist()], tmp_path / attention, attention)
        assert [p.name for p in paths] == ["layer0.png", "layer1.png"]
        for path in paths:
            with Image.open(path) as image:
                assert image.format == "PNG" and image.width > 200


def test_viz_command_on_a_trained_run(tmp_path, capsys):
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo.cli import main

    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    assert (
        main(["train", "--data", str(text), "--out", str(run), "--attention", "dcmha", "--steps", "4", *TINY_FLAGS])
        == 0
    )
    capsys.readouterr()
    assert main(["viz", str(run), "--prompt", "the king sat", "--out", str(tmp_path / "maps")]) == 0
    written = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert written == [f"layer{i}.png" for i in range(len(written))] and written
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"wrote {len(written)} attention heatmap(s), one PNG per layer with a panel per head, into " + (
        f"{tmp_path / 'maps'}:"
    )
    assert said[1:] == [f"  {tmp_path / 'maps' / name}" for name in written]
    assert main(["viz", str(run), "--prompt", ""]) == 1  # a clear one-line error, not a traceback
