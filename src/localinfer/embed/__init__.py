"""`localinfer embed`'s core: embeddings as plain values, inputs and output records."""
