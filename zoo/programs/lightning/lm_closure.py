"""Lightning automatic optimisation of a small transformer LM: a LightningModule wrapping Lightning's own demo
language model (lightning.pytorch.demos.Transformer: token embedding, sinusoidal positional encoding, an
nn.Transformer with 2 encoder and 2 decoder layers, d_model 128, 4 heads, feed-forward 512, dropout 0.2, a Linear
"decoder" to a vocabulary of 8,000 and log_softmax), NLL loss, AdamW, trained by lightning.Trainer for max_steps=2
on an in-memory dataset of 16 random (input, target) sequences of 128 tokens, batch 8, no worker processes. Lightning
calls optimizer.step(closure) and the forward (training_step) and backward run inside the closure. The Trainer is
given a single-device strategy on "cuda" (with a CPU accelerator whose device check accepts it), so Lightning itself
moves the model, built on the host in the LightningModule's __init__, to the device and each batch through
transfer_batch_to_device. A Callback starts the history (stacks="python") at on_train_batch_start of batch 1,
after that batch has been moved: the weights, AdamW's moments, the first step's gradients, the positional-encoding
table and the second batch predate the window. When fit ends, Lightning's teardown moves the model and the optimizer
state back to the host, so their device blocks are freed before the snapshot is taken."""

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.demos import Transformer
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader, TensorDataset

TORCH = "2.11"

VOCAB, SEQ, BATCH = 8000, 128, 8


class EmulatedCUDAAccelerator(CPUAccelerator):
    """Runs on the CPU capture's emulated CUDA device (a GPU run would say accelerator="gpu")."""

    def setup_device(self, device: torch.device) -> None:
        pass


class LanguageModel(LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Transformer(vocab_size=VOCAB, ninp=128, nhead=4, nhid=512, nlayers=2, dropout=0.2)

    def forward(self, inputs, target):
        return self.model(inputs, target)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return super().transfer_batch_to_device(batch, torch.device("cuda"), dataloader_idx)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        output = self(inputs, target)
        loss = F.nll_loss(output, target.view(-1))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.01)


class StartRecording(Callback):
    def __init__(self, cap):
        self.cap = cap

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            self.cap.record_memory_history(stacks="python", max_entries=200000)


def main(cap):
    with cap.host():
        tokens = torch.randint(0, VOCAB, (2 * BATCH, SEQ + 1))
        dataset = TensorDataset(tokens[:, :-1].clone(), tokens[:, 1:].clone())
        module = LanguageModel()
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=False, num_workers=0)
    trainer = Trainer(accelerator=EmulatedCUDAAccelerator(), strategy=SingleDeviceStrategy(torch.device("cuda")),
                      devices=1, max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[StartRecording(cap)])
    trainer.fit(module, loader)
    return module, trainer.optimizers
