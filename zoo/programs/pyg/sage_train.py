"""torch_geometric GraphSAGE node classification: the library's GraphSAGE model (2 SAGEConv layers, mean
aggregation, 128 → 256 → 256, ReLU, dropout 0.5) as an encoder, then a per-node MLP head (torch_geometric.nn.MLP:
Linear 256 → 256, BatchNorm1d, ReLU, dropout, Linear → 40 classes) over a random graph of 4,000 nodes, 40,000
directed edges and 128 float features, full-batch. The model is built directly on the device before recording; the
history is recorded (stacks="python") from just before the host-built torch_geometric.data.Data is moved with
data.to("cuda"), so only the weights predate the window; one AdamW training step with cross-entropy over the
training nodes."""

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import MLP
from torch_geometric.nn.models import GraphSAGE

TORCH = "2.11"
SETTINGS = "expandable_segments:True"


class SAGEClassifier(torch.nn.Module):
    def __init__(self, in_channels, hidden, num_classes):
        super().__init__()
        self.encoder = GraphSAGE(in_channels, hidden, num_layers=2, out_channels=hidden, dropout=0.5, aggr="mean")
        self.head = MLP([hidden, hidden, num_classes], norm="batch_norm", act="relu", dropout=0.5)

    def forward(self, x, edge_index):
        h = self.encoder(x, edge_index)
        return self.head(h)


def main(cap):
    num_nodes, num_edges, num_features, num_classes = 4000, 40000, 128, 40
    with cap.host():
        x = torch.randn(num_nodes, num_features)
        edge_index = torch.randint(0, num_nodes, (2, num_edges))
        y = torch.randint(0, num_classes, (num_nodes,))
        train_mask = torch.rand(num_nodes) < 0.6
        data = Data(x=x, edge_index=edge_index, y=y, train_mask=train_mask)
    model = SAGEClassifier(num_features, 256, num_classes).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    cap.record_memory_history(stacks="python", max_entries=100000)
    data = data.to("cuda")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return model, optimizer, data
