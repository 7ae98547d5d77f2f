int broken() { return 1 }
