module gpulane.local/hack/node/pause

go 1.26.0
