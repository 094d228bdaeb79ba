"""The admission belt of one live claim per slot: the webhook the API server calls before it stores a NodeClaim."""
