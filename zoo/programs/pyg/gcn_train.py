"""torch_geometric GCNConv node classification on a Cora-shaped random graph (2,708 nodes, 10,556 directed edges,
1,433 float features, 7 classes): 2 layers (1,433 → 256, ReLU, dropout → 7), symmetric normalisation with
self-loops recomputed every forward (cached=False), Adam with weight decay, full-batch. The graph is built on the
host as a torch_geometric.data.Data and moved with data.to("cuda"), the model built on the device; one warm-up
training step, then the history recorded (default stacks) for a second step, so the weights, the graph and Adam's
moments predate the window (the first step's gradients are let go by zero_grad's set_to_none)."""

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

TORCH = "2.6"


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden, num_classes):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, num_classes)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def main(cap):
    num_nodes, num_edges, num_features, num_classes = 2708, 10556, 1433, 7
    with cap.host():
        x = (torch.rand(num_nodes, num_features) < 0.0127).float()
        x = x / x.sum(dim=1, keepdim=True).clamp(min=1)      # row-normalised bag of words (NormalizeFeatures)
        edge_index = torch.randint(0, num_nodes, (2, num_edges))
        y = torch.randint(0, num_classes, (num_nodes,))
        train_mask = torch.zeros(num_nodes, dtype=torch.bool)
        train_mask[:140] = True
        data = Data(x=x, edge_index=edge_index, y=y, train_mask=train_mask)
    data = data.to("cuda")
    model = GCN(num_features, 256, num_classes).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for step in range(2):
        if step == 1:
            cap.record_memory_history()
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
    return model, optimizer, data
