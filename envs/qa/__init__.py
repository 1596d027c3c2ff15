"""Question answering and search: math word problems from a dataset, and questions
answered through a BM25 search tool over a generated world."""
