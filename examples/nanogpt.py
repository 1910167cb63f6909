"""A GPT of your own with any attnzoo attention: nanoGPT's model, its attention swapped for attnzoo.nn.SelfAttention.

    python examples/nanogpt.py --attention diff --position rope --steps 300
    python examples/nanogpt.py --attention dcmha --data my_text.txt --steps 300

Everything below is the user's code except the one layer; it trains on the Shakespeare corpus attnzoo ships (or a
text file), then samples from the prompt with the layer's KV cache.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.data import prepare_corpus
from attnzoo.nn import SelfAttention


class Block(nn.Module):
    def __init__(self, args, layer_idx):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
        self.attn = SelfAttention(
            args.attention,
            args.dim,
            args.n_heads,
            position=args.position,
            max_seq_len=args.block_size,
            layer_idx=layer_idx,
            n_layers=args.n_layers,
        )
        self.mlp = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache=cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, args, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, args.dim)
        self.blocks = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, vocab_size, bias=False)

    def forward(self, idx, caches=None):
        x = self.embed(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches else None)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, idx, new_tokens):
        caches = [block.attn.new_cache(idx.shape[0], idx.shape[1] + new_tokens) for block in self.blocks]
        logits = self(idx, caches)  # the prompt once, then one token a step against the cache
        for _ in range(new_tokens):
            idx = torch.cat((idx, logits[:, -1:].argmax(-1)), dim=1)
            logits = self(idx[:, -1:], caches)
        return idx


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention", default="diff", help="any registered mechanism: mha, diff, dcmha, ...")
    parser.add_argument("--position", default="rope", help="rope, alibi or none")
    parser.add_argument("--data", default="shakespeare", help="'shakespeare' or a text file")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    corpus = prepare_corpus(args.data)  # byte-level tokens, cached after the first run
    data = torch.from_numpy(corpus.train.astype("int64"))
    model = GPT(args, corpus.tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        starts = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
        batch = torch.stack([data[s : s + args.block_size + 1] for s in starts])
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    prompt = torch.from_numpy(corpus.tokenizer.encode("ROMEO:").astype("int64"))[None]
    print(corpus.tokenizer.decode(model.generate(prompt, 100)[0].tolist()))


if __name__ == "__main__":
    main()
