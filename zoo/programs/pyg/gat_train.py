"""torch_geometric GATConv node classification: 2 layers (64 features → 8 heads × 32 concatenated, ELU, dropout →
1 head × 16 classes), on a random graph of 3,000 nodes and 30,000 directed edges (self-loops added by GATConv)
with 64 float features, built on the host as a torch_geometric.data.Data and moved with data.to("cuda"). The model
is built on the host and moved with .to("cuda"); one Adam training step (cross-entropy on the train mask). The
history is recorded from the start, before the model and the graph are moved, so everything is in the window."""

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GATConv

TORCH = "2.13"


class GAT(torch.nn.Module):
    def __init__(self, in_channels, hidden, heads, num_classes):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=0.6)
        self.conv2 = GATConv(hidden * heads, num_classes, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


def main(cap):
    num_nodes, num_edges, num_features, num_classes = 3000, 30000, 64, 16
    with cap.host():
        x = torch.randn(num_nodes, num_features)
        edge_index = torch.randint(0, num_nodes, (2, num_edges))
        y = torch.randint(0, num_classes, (num_nodes,))
        train_mask = torch.rand(num_nodes) < 0.5
        data = Data(x=x, edge_index=edge_index, y=y, train_mask=train_mask)
        model = GAT(num_features, 32, 8, num_classes)
    cap.record_memory_history(stacks="python")
    device = torch.device("cuda")
    model = model.to(device)
    data = data.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return model, optimizer, data
