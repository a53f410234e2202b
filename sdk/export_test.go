package sdk

// compiledSchemas is how many compiled schemas the cache holds.
func compiledSchemas() int { return compiled.Len() }
