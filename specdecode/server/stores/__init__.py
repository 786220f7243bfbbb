"""What the server keeps between requests, each bounded in count and bytes: uploaded and result files, the Batches
API's batches, kept responses, conversations."""
