/// The built-in link profile names of SPEC §10: what a session may name when the admin API is built without a
/// configuration's list (`ProxyInstance` passes every profile of the running configuration, file ones included).
public enum LinkProfileNames {
    public static let builtIn: Set<String> = [
        "devtools-3g", "devtools-slow-4g", "devtools-fast-4g", "nlc-3g", "nlc-dsl", "nlc-lte", "nlc-very-bad-network",
        "geo-satellite",
    ]
}
