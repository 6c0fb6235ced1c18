"""torch_geometric graph classification: a batch of 64 small random graphs (20–100 nodes each, about 4 directed
edges per node, 32 float node features, 10 classes), made on the host as Data objects and collated with
Batch.from_data_list, then moved with .to("cuda"). The model: 3 GINConv layers (each with its per-node MLP:
Linear → BatchNorm1d → ReLU → Linear → ReLU, hidden 256, train_eps), the node states of all layers concatenated
(jumping knowledge, 768), a softmax attention pooling per graph (torch_geometric.nn.aggr.AttentionalAggregation:
a gate network Linear → ReLU → Linear → 1 scores each node, softmax over its graph, weighting a Linear transform of
the nodes that is summed per graph), then a Linear classifier and cross-entropy. Recording starts (stacks="all")
at the start of main, before the model is built directly on the device; one Adam training step."""

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINConv
from torch_geometric.nn.aggr import AttentionalAggregation

TORCH = "2.13"


def gin_mlp(in_channels, hidden):
    return nn.Sequential(nn.Linear(in_channels, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU())


class GINAttentionPool(nn.Module):
    def __init__(self, in_channels, hidden, num_layers, num_classes):
        super().__init__()
        self.convs = nn.ModuleList(
            [GINConv(gin_mlp(in_channels if i == 0 else hidden, hidden), train_eps=True) for i in range(num_layers)])
        width = hidden * num_layers
        self.pool = AttentionalAggregation(
            gate_nn=nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1)),
            nn=nn.Linear(width, hidden))
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x, edge_index, batch, num_graphs):
        states = []
        for conv in self.convs:
            x = conv(x, edge_index)
            states.append(x)
        h = torch.cat(states, dim=-1)
        g = self.pool(h, batch, dim_size=num_graphs)
        g = F.dropout(g, p=0.5, training=self.training)
        return self.classifier(g)


def random_graph(num_features, num_classes):
    n = int(torch.randint(20, 101, ()).item())
    edge_index = torch.randint(0, n, (2, 4 * n))
    return Data(x=torch.randn(n, num_features), edge_index=edge_index, y=torch.randint(0, num_classes, (1,)))


def main(cap):
    num_graphs, num_features, num_classes = 64, 32, 10
    cap.record_memory_history(stacks="all")
    model = GINAttentionPool(num_features, 256, 3, num_classes).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with cap.host():
        batch = Batch.from_data_list([random_graph(num_features, num_classes) for _ in range(num_graphs)])
    batch = batch.to("cuda")
    model.train()
    optimizer.zero_grad()
    logits = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
    loss = F.cross_entropy(logits, batch.y)
    loss.backward()
    optimizer.step()
    return model, optimizer
