"""REST API of API keys: list yours, make one (its secret in that response only), revoke one (and the keys it made).

Over the API a key can make and revoke only keys within its own scopes (marketplace/products/apikeys.py); a
session (the console, /api/docs/) any."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from marketplace.api.scopes import WITHIN_OWN_SCOPES
from marketplace.models import ApiKey
from marketplace.products import apikeys

SCOPES_HELP = "; ".join(f"{scope}: {said}" for scope, said in apikeys.SCOPE_SAID.items())


class ApiKeySerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=apikeys.SCOPES), help_text=SCOPES_HELP)
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "parent", "created_at", "last_used_at", "revoked_at", "active"]
        read_only_fields = fields
        extra_kwargs = {"prefix": {"help_text": "its first characters, to recognise it"},
                        "parent": {"help_text": "the key that made it (null: made in the console)"}}

    def get_active(self, key: ApiKey) -> bool:
        return key.revoked_at is None


class ApiKeyWithSecretSerializer(ApiKeySerializer):
    secret = serializers.CharField(read_only=True, help_text="the key itself, shown this once (only its hash is "
                                                             "kept): send it as `Authorization: Bearer <secret>`")

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["secret"]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80, help_text="what uses it, e.g. ci-runner")
    scopes = serializers.MultipleChoiceField(choices=apikeys.SCOPES, allow_empty=False, help_text=SCOPES_HELP)


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your API keys, revoked ones too (newest first). POST makes one: its `secret` is in that response only.
    DELETE revokes one, and every key made with it."""

    serializer_class = ApiKeySerializer
    queryset = ApiKey.objects.none()  # the schema's path types; requests use get_queryset
    write_scope = WITHIN_OWN_SCOPES

    def get_queryset(self):
        return ApiKey.objects.filter(user=self.request.user).order_by("-created_at")

    def _asking_key(self) -> ApiKey | None:
        return self.request.auth if isinstance(self.request.auth, ApiKey) else None

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeyWithSecretSerializer})
    def create(self, request):
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key, secret = apikeys.api_key_create(user=request.user, name=data.validated_data["name"],
                                             scopes=data.validated_data["scopes"], by_key=self._asking_key())
        key.secret = secret
        return Response(ApiKeyWithSecretSerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        apikeys.api_key_revoke(user=request.user, key_id=self.get_object().pk, by_key=self._asking_key())
        return Response(status=status.HTTP_204_NO_CONTENT)
