"""What several drafters share: base classes and the registry's entry, draft depth priced by row costs, model
steps, trained heads' networks and files, the draft vocabulary shortlist, n-gram and suffix indexes, the text
bridge between tokenizers."""
