"""Held-out (issue 41, item 8): a LightningModule with the Trainer's defaults (32-true precision, automatic
optimization, so the whole step runs inside optimizer.step(closure)); a small CNN on 64x64 images that its
Dataset makes and augments on the CPU, 2 DataLoader workers. Nothing in the tool was fitted on it."""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 72, 72, generator=g)
        dx, dy = torch.randint(0, 8, (2,), generator=g).tolist()
        x = x[:, dy:dy + 64, dx:dx + 64]
        if i % 2:
            x = x.flip(-1)
        return (x - 0.5) / 0.25, i % 100


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
        self.net = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100))

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    loader = DataLoader(Images(), batch_size=128, num_workers=a.workers, shuffle=True)
    L.Trainer(max_steps=a.steps, logger=False, enable_checkpointing=False).fit(Net(), loader)
