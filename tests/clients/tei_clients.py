"""TEI's clients against the service's /tei, run in their own environment (.venv-clients) by
tests/app/test_tei_clients.py: prints what each client answers, as JSON, for the test to compare with the native
routes' answers.

    .venv-clients/bin/python tests/clients/tei_clients.py BASE_URL TEXT...
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    base, texts = sys.argv[1], sys.argv[2:]
    os.environ["HF_HUB_OFFLINE"] = "0"  # huggingface_hub refuses every request, localhost too, while it is set
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
        HuggingFaceTEISparseTextEmbedder,
    )
    from huggingface_hub import InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    answers: dict[str, object] = {}
    # LangChain (≥ 1.2.2 takes a repo id as `model`, not a URL): an InferenceClient built on the URL
    langchain = HuggingFaceEndpointEmbeddings(model="any/model")
    langchain.client = InferenceClient(model=f"{base}/tei")
    answers["langchain_documents"] = langchain.embed_documents(texts)
    answers["langchain_query"] = langchain.embed_query(texts[0])
    llama = TextEmbeddingsInference(model_name="any", base_url=f"{base}/tei")
    answers["llamaindex"] = llama.get_text_embedding_batch(texts)
    no_token = Secret.from_token("unused")
    api = {"url": f"{base}/tei"}
    text = HuggingFaceAPITextEmbedder(api_type="text_embeddings_inference", api_params=api, token=no_token)
    answers["haystack_text"] = text.run(texts[0])["embedding"]
    documents = HuggingFaceAPIDocumentEmbedder(api_type="text_embeddings_inference", api_params=api, token=no_token)
    embedded = documents.run(documents=[Document(content=t) for t in texts])["documents"]
    answers["haystack_documents"] = [document.embedding for document in embedded]
    sparse = HuggingFaceTEISparseTextEmbedder(api_base_url=f"{base}/models/splade/tei").run(texts[0])
    answers["haystack_sparse"] = {
        "indices": sparse["sparse_embedding"].indices,
        "values": sparse["sparse_embedding"].values,
    }
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
