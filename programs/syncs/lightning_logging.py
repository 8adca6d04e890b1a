"""A LightningModule that logs the way Lightning's docs show (issue 43): its loss with prog_bar=True and
sync_dist=True every step, under the Trainer's defaults. The syncs are Lightning's (its progress bar and its
metric reduction read the logged tensor on the host): the sync finding must name Lightning's own line, not a
line of torch, and the module's range.
"""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True, sync_dist=True)  # LIGHTNING_LOG
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    a = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(a.steps * 256, 256), torch.randint(0, 10, (a.steps * 256,)))
    trainer = L.Trainer(max_steps=a.steps, max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(Net(), DataLoader(data, batch_size=256, num_workers=2))
