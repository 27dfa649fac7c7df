"""Where model files come from: the Hugging Face Hub, HTTP transfers, and Python packages."""
