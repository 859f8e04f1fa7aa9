"""Small models written in plain PyTorch, used by the book and the benchmarks: an MLP, a small
CNN and a GPT-style transformer block. Random weights; nothing is downloaded."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width=1024, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x)) + x
        return self.norm(x)


class SmallCNN(nn.Module):
    def __init__(self, channels=32, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels * 2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels * 2)
        self.fc = nn.Linear(channels * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = x.mean((2, 3))
        return self.fc(x)


class Block(nn.Module):
    """A GPT-2 style block: pre-norm causal self-attention and an MLP, with residuals."""

    def __init__(self, dim=768, heads=12):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


def model_and_input(name: str, device, scale: float = 1.0):
    """(model in eval mode, example input) for 'mlp', 'cnn' or 'gpt_block'; scale < 1 shrinks
    the batch for CPUs."""
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().to(device).eval(), torch.randn(max(1, int(4096 * scale)), 1024, device=device)
    if name == "cnn":
        return SmallCNN().to(device).eval(), torch.randn(max(1, int(128 * scale)), 3, 32, 32, device=device)
    if name == "gpt_block":
        return Block().to(device).eval(), torch.randn(max(1, int(16 * scale)), 512, 768, device=device)
    raise ValueError(name)


_ = math
