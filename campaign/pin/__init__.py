"""`pin`: a manifest's checkpoint hashes (Hugging Face Hub) and image digests (OCI registries), resolved."""
