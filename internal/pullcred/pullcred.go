package pullcred

// Used is the credential a pull succeeded with. Provider is the credential
// provider plugin whose credential it was; "" when it was none of the
// plugins' (the request's own credential, or no credential). A plugin fed
// the pulling pod's service-account token (KEP-4412) names that account:
// its credential is the account's, not the node's.
type Used struct {
	Provider       string
	ServiceAccount *ServiceAccount
}

// ServiceAccount names a service account.
type ServiceAccount struct {
	Namespace, Name, UID string
}
