"""Write a LLaVA-Med-v1.5-7B-shaped checkpoint with random bf16 weights, a stand-in for the hub
release on a machine without the hub (`make gpu-check`): the shipped architecture config, a
byte-level BPE tokenizer with LLaVA's special tokens, LLaVA's CLIP processor at 336 px. The
vocabulary keeps the real 32,064 rows; the stand-in tokenizer uses ~400 of them. `--small`: 2
narrow decoder layers and 2 vision layers, same processor (the ZeRO-2 stage).

    python benchmarks/random_checkpoint.py OUT_DIR [--small]
"""

import sys
import time

import torch
from transformers import AutoModelForImageTextToText, CLIPImageProcessorPil, LlavaProcessor

from medvqa.models.architectures import load_architecture
from medvqa.zoo.families import build_tokenizer

out = sys.argv[1]
small = "--small" in sys.argv
t0 = time.time()
config, pre = load_architecture("chaoyinshe/llava-med-v1.5-mistral-7b-hf")
tok = build_tokenizer("llava", 32000)
text = config.get_text_config(decoder=True)
if small:
    text.num_hidden_layers, text.hidden_size, text.intermediate_size = 2, 256, 512
    text.num_attention_heads, text.num_key_value_heads, text.head_dim = 4, 2, 64
    config.vision_config.num_hidden_layers = 2
config.image_token_index = tok.convert_tokens_to_ids("<image>")
text.bos_token_id, text.eos_token_id, text.pad_token_id = (
    tok.bos_token_id,
    tok.eos_token_id,
    tok.pad_token_id,
)
proc = LlavaProcessor(
    image_processor=CLIPImageProcessorPil(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
    ),
    tokenizer=tok,
    patch_size=14,
    vision_feature_select_strategy="default",
    num_additional_image_tokens=1,
    chat_template=tok.chat_template,
)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
with torch.device(device):
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
model.generation_config.pad_token_id = tok.pad_token_id
model.generation_config.eos_token_id = tok.eos_token_id
model.generation_config.bos_token_id = tok.bos_token_id
n = sum(p.numel() for p in model.parameters())
t1 = time.time()
model.save_pretrained(out, max_shard_size="4GB")
proc.save_pretrained(out)
print(
    f"params {n / 1e9:.2f} B, vocab {text.vocab_size} (tokenizer {len(tok)}), image token "
    f"{config.image_token_index}; built in {t1 - t0:.1f} s, saved in {time.time() - t1:.1f} s to {out}"
)
