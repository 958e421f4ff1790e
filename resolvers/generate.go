package resolvers

// graph/ is gqlgen's output for ../schema.graphqls and ../gqlgen.yml;
// regenerate it rather than editing it, and commit the result. gqlgen reads
// its paths relative to the working directory, hence the cd.
//go:generate sh -c "cd .. && go tool gqlgen generate"
