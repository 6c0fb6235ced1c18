"""An LSTM language model in the layout of PyTorch's word_language_model example (an nn.Embedding of 256, dropout,
a 2-layer nn.LSTM with hidden 256 and dropout 0.2, a Linear decoder over a 10,000-word vocabulary), trained by
truncated backpropagation through time on a token stream: batch 16 × 64-token chunks, the hidden state carried
across chunks and detached between them, cross-entropy over the vocabulary, gradient clipping at 0.25, Adam
(lr 1e-3). The model is built on the host and moved to the device; two chunks are trained, the history recorded
(stacks="all") for the second only, so the weights, Adam's moments and the carried hidden state predate the
window."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH = "2.6"

VOCAB, BATCH, BPTT = 10000, 16, 64


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=256, nhid=256, nlayers=2, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def main(cap):
    with cap.host():
        stream = torch.randint(0, VOCAB, (BATCH * (2 * BPTT + 1),))
        model = RNNModel(VOCAB)
    data = stream.view(BATCH, -1).t().contiguous().to("cuda")      # (time, batch), as batchify() makes it
    model.to("cuda")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    hidden = model.init_hidden(BATCH)
    for chunk, i in enumerate(range(0, 2 * BPTT, BPTT)):
        if chunk == 1:
            cap.record_memory_history(stacks="all")
        inputs, targets = data[i:i + BPTT], data[i + 1:i + 1 + BPTT].reshape(-1)
        hidden = repackage_hidden(hidden)
        optimizer.zero_grad()
        output, hidden = model(inputs, hidden)
        loss = F.nll_loss(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
    return model, optimizer, hidden
