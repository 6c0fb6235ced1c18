"""transformers RwkvForCausalLM (RWKV-4: time mixing by the WKV linear recurrence, here its CPU/PyTorch loop over
the tokens since the wkv CUDA kernel is not loaded; channel mixing by a squared-ReLU feed-forward gated by a
sigmoid receptance), 3 layers, hidden 256, feed-forward 1,024, vocab 6,000 (head not tied), batch 4 × 128 tokens,
one training step with SGD (momentum 0.9, nesterov) on the model's own cross-entropy loss (labels passed to the
model). The model is built on the host; the history is recorded from before model.to("cuda"), so the weights'
copies, the gradients and the momentum buffers are all made inside the window."""

import torch
from transformers import RwkvConfig, RwkvForCausalLM

TORCH = "2.6"


def main(cap):
    config = RwkvConfig(vocab_size=6000, context_length=128, hidden_size=256, attention_hidden_size=256,
                        intermediate_size=1024, num_hidden_layers=3, rescale_every=6, tie_word_embeddings=False,
                        use_cache=False)
    with cap.host():
        model = RwkvForCausalLM(config)
        batch = torch.randint(0, 6000, (4, 128))
    cap.record_memory_history(max_entries=200000)
    model.to("cuda")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
    input_ids = batch.to("cuda")
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
