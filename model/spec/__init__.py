"""What a model is, without torch: its config, its checkpoint's modules and tensor names, its tokenizer, its card
and capabilities, and the payloads a pass is asked for and gives back. A front end reads only these."""
