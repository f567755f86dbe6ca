"""The demo from Python (scripts/demo.sh runs it after the YAML one): the same job from examples/demo.yaml, then the
trained model asked to reverse three words. Run from the repository root with PYTHONPATH=python (or pip install .)."""
import soltrain

soltrain.Trainer(soltrain.SFTConfig.from_yaml("examples/demo.yaml").replace(output_dir="runs/demo-py")).train()
model, tok = soltrain.Model.from_pretrained("runs/demo-py/model", sequence_len=256), soltrain.Tokenizer("runs/demo-py/model")
for word in ["hello", "world", "python"]:
    prompt = tok.apply_chat_template([{"role": "user", "content": word}], add_generation_prompt=True, enable_thinking=False)
    print(f"  {word} -> {tok.decode(model.generate(tok.encode(prompt), 24), skip_special_tokens=True)}")
